package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/engramkv/engram/core/etcdfmt"
)

// OpenOptions tunes Open.
type OpenOptions struct {
	// SkipHashCheck opens a file without checking its sha256 trailer, or
	// one without a trailer (a db file copied from an etcd data
	// directory), as etcdutl's --skip-hash-check does. bbolt trusts the
	// page numbers it finds; a file corrupted inside its pages can then
	// still crash the process while bbolt checks it, as it can crash
	// etcdutl.
	SkipHashCheck bool
	// SkipRowScan leaves out the decode of every key-bucket row: Info's
	// TotalKeys and Hash stay 0 (the rest comes from the meta bucket, the
	// key bucket's last key and its page statistics). For a caller that
	// reads every row through Entries, which decodes and checks each row
	// anyway: a restore saves a pass over the file.
	SkipRowScan bool
	// DeferHashCheck checks the sha256 trailer on a goroutine of its
	// own while the caller reads the rows, instead of before Open
	// returns: the hash no longer delays the reads. Unless SkipHashCheck,
	// Open then reads only the meta bucket and the key bucket's last
	// row, and Info's TotalKeys, Hash and Rows stay 0. Nothing read may
	// be trusted before VerifyHash returns nil. Reads of a damaged file
	// fail with ErrHashMismatch (bbolt's panics are recovered, and the
	// reads stop once the hash is known not to match).
	DeferHashCheck bool
}

// File is an open snapshot file. Its methods but Close may be called
// concurrently.
type File struct {
	path string
	db   *bolt.DB
	info Info
	// size is the bbolt database's size: the part of the mapping
	// releasePages may release.
	size int64
	// hash is the deferred sha256 check (OpenOptions.DeferHashCheck),
	// nil when there is none.
	hash *hashCheck
}

// releaseEvery is how many bytes of rows a scan reads between releases of
// the mapping's resident pages: the scan holds at most about this much of
// the file resident.
const releaseEvery = 64 << 20

// lockTimeout bounds the wait for bbolt's shared file lock: a file held by
// a running etcd (an exclusive lock) is not a snapshot to read.
const lockTimeout = 5 * time.Second

// Open checks and opens a snapshot file read-only.
//
// If its size % 512 == 32 the last 32 bytes are a sha256 trailer (as
// `etcdctl snapshot save` writes it) and must match the sha256 of what
// precedes them, unless opts.SkipHashCheck; without a trailer Open refuses
// unless opts.SkipHashCheck, as `etcdutl snapshot restore` does. It then
// runs bbolt's integrity check (as `etcdutl snapshot status` does) on a
// file whose hash it did not check, needs the meta and key buckets, and
// reads the whole file once to compute Info and to check that every
// key-bucket row decodes. A matching trailer makes bbolt's check
// redundant: the bytes are the ones etcd hashed as it wrote them, and
// `etcdutl snapshot restore` does not run it either (it costs a read of
// every page).
//
// bbolt opens a file with a trailer as it is: it maps the file and reads
// only the pages its meta page counts, so the 32 extra bytes are never
// looked at (etcdutl's status relies on the same). Open checks that the
// file holds every counted page before bbolt reads any page but the meta
// pages, since reading a page past the end of a mapped file faults.
//
// Errors wrap ErrNotBolt, ErrTruncated, ErrHashMismatch, ErrNoTrailer,
// ErrCorrupt, ErrNoMetaBucket, ErrNoKeyBucket or etcdfmt.ErrMalformed.
func Open(path string, opts OpenOptions) (*File, error) {
	f, err := open(path, opts)
	if err != nil {
		return nil, fmt.Errorf("snapshot: open %s: %w", path, err)
	}
	return f, nil
}

func open(path string, opts OpenOptions) (_ *File, err error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	pageSize, err := probe(fh, size)
	if err != nil {
		return nil, err
	}
	trailer := hasTrailer(size)
	dataSize := size
	if trailer {
		dataSize -= trailerLen
	}
	if dataSize < 2*pageSize {
		return nil, fmt.Errorf("%w: %d bytes, less than two %d-byte meta pages", ErrTruncated, dataSize, pageSize)
	}

	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: lockTimeout})
	if err != nil {
		if errors.Is(err, berrors.ErrInvalid) || errors.Is(err, berrors.ErrVersionMismatch) || errors.Is(err, berrors.ErrChecksum) {
			return nil, fmt.Errorf("%w: %w", ErrNotBolt, err)
		}
		return nil, fmt.Errorf("bbolt: %w", err)
	}
	defer func() {
		if err != nil {
			_ = db.Close()
		}
	}()
	var boltSize int64
	_ = db.View(func(tx *bolt.Tx) error { boltSize = tx.Size(); return nil })
	if boltSize > dataSize {
		return nil, fmt.Errorf("%w: the file holds %d bytes of the %d its meta page counts", ErrTruncated, dataSize, boltSize)
	}

	f := &File{path: path, db: db, size: boltSize}
	if !opts.SkipHashCheck {
		if !trailer {
			return nil, ErrNoTrailer
		}
		want := make([]byte, trailerLen)
		if _, err := fh.ReadAt(want, dataSize); err != nil {
			return nil, fmt.Errorf("read trailer: %w", err)
		}
		if opts.DeferHashCheck {
			f.hash = startHashCheck(path, dataSize, want)
			defer func() {
				if err != nil {
					err = f.hashFirst(err)
					f.hash.cancel()
				}
			}()
		} else if err := checkTrailer(fh, dataSize, want); err != nil {
			return nil, err
		}
	}

	err = guard(func() error {
		return db.View(func(tx *bolt.Tx) error {
			if opts.SkipHashCheck {
				if err := check(tx); err != nil {
					return err
				}
			}
			scanner := scan
			switch {
			case f.hash != nil:
				// Nothing that walks the pages before the
				// hash is known (a damaged tree may loop).
				scanner = scanMetaUncounted
			case opts.SkipRowScan:
				scanner = scanMeta
			}
			info, err := scanner(tx)
			f.info = info
			f.info.HasHashTrailer = trailer
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	// The check and the scan read every page.
	releasePages(db, boltSize)
	return f, nil
}

// probe reads a bbolt meta page's header: magic, version, page size (host
// byte order, as bbolt writes it). bbolt falls back to the second meta page
// at the OS page size when the first is damaged, and so does probe.
func probe(f *os.File, size int64) (int64, error) {
	const (
		pageHeader = 16
		magic      = 0xED0CDAED
		version    = 2
	)
	var b [pageHeader + 12]byte
	for _, off := range []int64{0, int64(os.Getpagesize())} {
		if off+int64(len(b)) > size {
			break
		}
		if _, err := f.ReadAt(b[:], off); err != nil {
			return 0, err
		}
		m := b[pageHeader:]
		ps := int64(binary.NativeEndian.Uint32(m[8:]))
		if binary.NativeEndian.Uint32(m) == magic && binary.NativeEndian.Uint32(m[4:]) == version && ps >= 512 && (off == 0 || off == ps) {
			return ps, nil
		}
	}
	return 0, fmt.Errorf("%w: no bbolt meta page", ErrNotBolt)
}

func checkTrailer(f *os.File, dataSize int64, want []byte) error {
	got, err := sha256Prefix(f, dataSize)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("%w: trailer %x, database %x", ErrHashMismatch, want, got)
	}
	return nil
}

// sha256Prefix returns the sha256 of f's first n bytes.
func sha256Prefix(f *os.File, n int64) ([]byte, error) {
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, n)); err != nil {
		return nil, fmt.Errorf("hash: %w", err)
	}
	return h.Sum(nil), nil
}

// check runs bbolt's integrity check.
func check(tx *bolt.Tx) error {
	const maxShown = 10
	var errs []string
	n := 0
	for err := range tx.Check() {
		if n++; n <= maxShown {
			errs = append(errs, err.Error())
		}
	}
	if n > 0 {
		return fmt.Errorf("%w: %d errors: %s", ErrCorrupt, n, strings.Join(errs, "; "))
	}
	return nil
}

// scan reads every bucket once, in bbolt order, into an Info; it checks
// that the buckets etcd needs exist and that key-bucket rows decode.
func scan(tx *bolt.Tx) (Info, error) {
	if tx.Bucket(etcdfmt.BucketMeta) == nil {
		return Info{}, ErrNoMetaBucket
	}
	if tx.Bucket(etcdfmt.BucketKey) == nil {
		return Info{}, ErrNoKeyBucket
	}
	ib := newInfoBuilder()
	c := tx.Cursor()
	for name, _ := c.First(); name != nil; name, _ = c.Next() {
		b := tx.Bucket(name)
		if b == nil {
			return Info{}, fmt.Errorf("%w: root key %q is not a bucket", ErrCorrupt, name)
		}
		ib.bucket(name)
		isKey, isMeta := bytes.Equal(name, etcdfmt.BucketKey), bytes.Equal(name, etcdfmt.BucketMeta)
		var prev etcdfmt.Revision
		err := b.ForEach(func(k, v []byte) error {
			ib.row(k, v)
			if isKey {
				ib.rows++
			}
			switch {
			case isKey && isRevisionMarker(k, v):
				r, _, err := etcdfmt.ParseBucketKey(k)
				if err != nil {
					return err
				}
				prev = r
				ib.lastMain = max(ib.lastMain, r.Main)
			case isKey:
				// Only counted: the row need not outlive the call.
				e, err := decodeRow(k, v, prev, true)
				if err != nil {
					return err
				}
				prev = e.Rev
				ib.keyRow(&e)
			case isMeta:
				return ib.metaRow(k, v)
			}
			return nil
		})
		if err != nil {
			return Info{}, err
		}
	}
	return ib.info(tx.Size(), false), nil
}

// scanMeta is scan without the key bucket's rows: it reads the meta bucket,
// the key bucket's last revision and its row count.
func scanMeta(tx *bolt.Tx) (Info, error) {
	info, err := scanMetaUncounted(tx)
	if err != nil {
		return info, err
	}
	// Stats walks every page of the bucket.
	info.Rows = tx.Bucket(etcdfmt.BucketKey).Stats().KeyN
	return info, nil
}

// scanMetaUncounted is scanMeta without the row count, which walks every
// page of the key bucket: it reads only the meta bucket and the key
// bucket's last row.
func scanMetaUncounted(tx *bolt.Tx) (Info, error) {
	meta, keys := tx.Bucket(etcdfmt.BucketMeta), tx.Bucket(etcdfmt.BucketKey)
	if meta == nil {
		return Info{}, ErrNoMetaBucket
	}
	if keys == nil {
		return Info{}, ErrNoKeyBucket
	}
	ib := newInfoBuilder()
	if err := meta.ForEach(ib.metaRow); err != nil {
		return Info{}, err
	}
	// Keys are revisions, big-endian: the last one is the highest.
	if k, _ := keys.Cursor().Last(); k != nil {
		r, _, err := etcdfmt.ParseBucketKey(k)
		if err != nil {
			return Info{}, fmt.Errorf("key bucket row %x: %w", k, err)
		}
		ib.lastMain = r.Main
	}
	out := ib.info(tx.Size(), false)
	out.Hash = 0
	return out, nil
}

// isRevisionMarker reports a key-bucket row with an empty value: no version
// of any key, but the mark `etcdutl snapshot restore --bump-revision` leaves
// at the bumped revision so that etcd starts there. Only its revision
// matters (until etcd's next compaction removes it).
func isRevisionMarker(k, v []byte) bool {
	return len(v) == 0 && len(k) == etcdfmt.RevBytesLen
}

// decodeRow decodes one key-bucket row that follows a row at prev (the
// zero Revision for the first row).
// decodeRow decodes a key-bucket row, into fresh memory or (view) into
// slices of k and v.
func decodeRow(k, v []byte, prev etcdfmt.Revision, view bool) (etcdfmt.Entry, error) {
	decode := etcdfmt.DecodeEntry
	if view {
		decode = etcdfmt.DecodeEntryView
	}
	e, err := decode(k, v)
	if err != nil {
		return e, fmt.Errorf("key bucket row %x: %w", k, err)
	}
	// bbolt orders keys, but a revision may appear both with and without
	// the tombstone mark.
	if prev != (etcdfmt.Revision{}) && !prev.Less(e.Rev) {
		return e, fmt.Errorf("key bucket row %x: %w: revision %d/%d appears twice", k, etcdfmt.ErrMalformed, e.Rev.Main, e.Rev.Sub)
	}
	return e, nil
}

// guard turns bbolt's panics on a damaged file, and faults reading past its
// mapping, into ErrCorrupt. A panic in fn's callbacks that inCallback
// reports is not bbolt's and is passed on.
func guard(fn func() error) (err error) {
	return guardCallbacks(func(*bool) error { return fn() })
}

func guardCallbacks(fn func(inCallback *bool) error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	var inCallback bool
	defer func() {
		if r := recover(); r != nil {
			if inCallback {
				panic(r)
			}
			err = fmt.Errorf("%w: %v", ErrCorrupt, r)
		}
	}()
	return fn(&inCallback)
}

// Info returns what Open found out about the file.
func (f *File) Info() Info { return f.info }

// VerifyHash waits for the sha256 check OpenOptions.DeferHashCheck left
// running and returns its result: nil when the trailer matches or when
// Open checked it (or skipped it) itself.
func (f *File) VerifyHash() error {
	if f.hash == nil {
		return nil
	}
	if err := f.hash.wait(); err != nil {
		return fmt.Errorf("snapshot: %s: %w", f.path, err)
	}
	return nil
}

// hashFirst returns the deferred check's mismatch in place of err, the
// failure of a read: a file whose hash does not match is damaged, and
// whatever a read of it found out is the symptom.
func (f *File) hashFirst(err error) error {
	if f.hash == nil {
		return err
	}
	if herr := f.hash.wait(); errors.Is(herr, ErrHashMismatch) {
		return herr
	}
	return err
}

// Entries calls fn with every key-bucket row in revision order. Rows are
// decoded with etcdfmt.DecodeEntry into fresh memory, so fn may keep them.
// Latest is not set: it would need the rows that follow. An error of fn is
// returned as it is.
func (f *File) Entries(ctx context.Context, fn func(*etcdfmt.Entry) error) error {
	return f.entries(ctx, fn, false)
}

// EntriesView is Entries for a reader that copies what it keeps at once:
// the entry's byte slices point into the file and are valid only until fn
// returns. A restore's sort saves an allocation per row.
func (f *File) EntriesView(ctx context.Context, fn func(*etcdfmt.Entry) error) error {
	return f.entries(ctx, fn, true)
}

func (f *File) entries(ctx context.Context, fn func(*etcdfmt.Entry) error, view bool) error {
	err := guardCallbacks(func(inCallback *bool) error {
		return f.db.View(func(tx *bolt.Tx) error {
			b := tx.Bucket(etcdfmt.BucketKey)
			var prev etcdfmt.Revision
			n, read := 0, 0
			defer releasePages(f.db, f.size)
			c := b.Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				if read += len(k) + len(v); read >= releaseEvery {
					releasePages(f.db, f.size)
					read = 0
				}
				if n%ctxCheckEvery == 0 {
					if err := ctx.Err(); err != nil {
						return err
					}
					if f.hash != nil && f.hash.failed.Load() {
						return f.hash.err
					}
				}
				n++
				if isRevisionMarker(k, v) {
					// Info.Revision accounts for it; it holds no key.
					prev, _, _ = etcdfmt.ParseBucketKey(k)
					continue
				}
				e, err := decodeRow(k, v, prev, view)
				if err != nil {
					return err
				}
				prev = e.Rev
				*inCallback = true
				if err := fn(&e); err != nil {
					return callbackError{err}
				}
				*inCallback = false
			}
			return nil
		})
	})
	var ce callbackError
	if errors.As(err, &ce) {
		return ce.err
	}
	if err != nil {
		return fmt.Errorf("snapshot: %s: %w", f.path, f.hashFirst(err))
	}
	return nil
}

// callbackError carries a callback's error past Entries' wrapping.
type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }

// Leases returns the lease bucket's leases in bucket order (none when the
// file has no lease bucket, which etcd accepts).
func (f *File) Leases() ([]etcdfmt.Lease, error) {
	var ls []etcdfmt.Lease
	err := guard(func() error {
		return f.db.View(func(tx *bolt.Tx) error {
			b := tx.Bucket(etcdfmt.BucketLease)
			if b == nil {
				return nil
			}
			return b.ForEach(func(k, v []byte) error {
				l, err := etcdfmt.DecodeLease(v)
				if err != nil {
					return fmt.Errorf("lease bucket row %x: %w", k, err)
				}
				if len(k) != 8 || int64(binary.BigEndian.Uint64(k)) != l.ID {
					return fmt.Errorf("lease bucket row %x: %w: holds lease %d", k, etcdfmt.ErrMalformed, l.ID)
				}
				ls = append(ls, l)
				return nil
			})
		})
	})
	if err != nil {
		return nil, fmt.Errorf("snapshot: %s: %w", f.path, f.hashFirst(err))
	}
	return ls, nil
}

// Close closes the file. It is safe to call more than once.
func (f *File) Close() error {
	if f.db == nil {
		return nil
	}
	if f.hash != nil {
		f.hash.cancel()
	}
	db := f.db
	f.db = nil
	if err := db.Close(); err != nil {
		return fmt.Errorf("snapshot: close %s: %w", f.path, err)
	}
	return nil
}
