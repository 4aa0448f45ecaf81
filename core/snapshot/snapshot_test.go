package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/engramkv/engram/core/etcdfmt"
)

var testLeases = []etcdfmt.Lease{
	{ID: 0x694d7a8b2c3d4e5f, TTL: 60, RemainingTTL: 42},
	{ID: 7, TTL: 10},
	{ID: 1 << 40, TTL: 3600, RemainingTTL: 3600},
}

func leaseIDs(ls []etcdfmt.Lease) []int64 {
	var ids []int64
	for _, l := range ls {
		ids = append(ids, l.ID)
	}
	return ids
}

// writeHistory writes a compacted history of revs revisions and returns
// the file, its rows and the Info Write returned.
func writeHistory(t *testing.T, revs, maxValue int, leases []etcdfmt.Lease) (string, []etcdfmt.Entry, WriteOptions, Info) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(revs), uint64(maxValue)))
	all := genHistory(rng, revs, 40, maxValue, leaseIDs(leases))
	last := all[len(all)-1].Rev.Main
	opts := WriteOptions{CompactRev: last / 2, Revision: last, Leases: leases}
	rows := compact(all, opts.CompactRev)
	path := filepath.Join(t.TempDir(), "snap.db")
	info, err := Write(t.Context(), path, opts, feed(rows))
	if err != nil {
		t.Fatal(err)
	}
	return path, rows, opts, info
}

func TestWriteOpenRoundTrip(t *testing.T) {
	// 6 MB of values: more than one write transaction.
	path, rows, opts, winfo := writeHistory(t, 3000, 4000, testLeases)

	want := Info{
		Revision:            opts.Revision,
		CompactRev:          opts.CompactRev,
		ScheduledCompactRev: opts.CompactRev,
		TotalKeys:           liveCount(rows),
		Rows:                len(rows),
		StorageVersion:      "3.6.0",
		TotalSize:           winfo.TotalSize,
		Hash:                winfo.Hash,
	}
	if winfo != want {
		t.Fatalf("Write's Info = %+v, want %+v", winfo, want)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != winfo.TotalSize || fi.Size()%4096 != 0 {
		t.Errorf("file size %d, Info.TotalSize %d: want equal, whole pages", fi.Size(), winfo.TotalSize)
	}

	check := func(t *testing.T, f *File, want Info) {
		t.Helper()
		if got := f.Info(); got != want {
			t.Errorf("Info = %+v, want %+v", got, want)
		}
		if err := diffRows(readEntries(t, f), rows); err != nil {
			t.Error(err)
		}
		ls, err := f.Leases()
		if err != nil {
			t.Fatal(err)
		}
		wantLeases := slices.Clone(testLeases)
		slices.SortFunc(wantLeases, func(a, b etcdfmt.Lease) int { return bytes.Compare(etcdfmt.LeaseKey(a.ID), etcdfmt.LeaseKey(b.ID)) })
		if !slices.Equal(ls, wantLeases) {
			t.Errorf("Leases = %v, want %v", ls, wantLeases)
		}
	}

	t.Run("no trailer", func(t *testing.T) {
		if _, err := Open(path, OpenOptions{}); !errors.Is(err, ErrNoTrailer) {
			t.Fatalf("Open without SkipHashCheck = %v, want %v", err, ErrNoTrailer)
		}
		f, err := Open(path, OpenOptions{SkipHashCheck: true})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		check(t, f, want)
	})

	t.Run("skip row scan", func(t *testing.T) {
		f, err := Open(path, OpenOptions{SkipHashCheck: true, SkipRowScan: true})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		quick := want
		quick.TotalKeys, quick.Hash = 0, 0
		check(t, f, quick)
	})

	t.Run("trailer", func(t *testing.T) {
		withTrailer := filepath.Join(t.TempDir(), "snap.db")
		copyFile(t, path, withTrailer)
		if err := AppendTrailer(withTrailer); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(withTrailer)
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(b[:len(b)-32]); !bytes.Equal(sum[:], b[len(b)-32:]) || len(b)%512 != 32 {
			t.Fatalf("AppendTrailer left %d bytes ending in %x, want sha256 %x", len(b), b[len(b)-32:], sum)
		}
		// bbolt reads the file with its trailer as it is.
		f, err := Open(withTrailer, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		want := want
		want.HasHashTrailer = true
		check(t, f, want)
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}

func TestWriteLatestOnly(t *testing.T) {
	// A snapshot of only the latest versions: the last revision was a
	// delete, so no row carries it; CompactRev = Revision keeps it.
	rows := []etcdfmt.Entry{
		{Rev: etcdfmt.Revision{Main: 3}, KV: kv("a", 2, 3, 2, "x")},
		{Rev: etcdfmt.Revision{Main: 5, Sub: 1}, KV: kv("c", 5, 5, 1, "y")},
	}
	path := filepath.Join(t.TempDir(), "snap.db")
	if _, err := Write(t.Context(), path, WriteOptions{Revision: 9}, feed(rows)); err == nil || !strings.Contains(err.Error(), "revision 9") {
		t.Fatalf("Write of revision 9 without CompactRev = %v, want refusal naming revision 9", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("refused Write left %s: %v", path, err)
	}
	info, err := Write(t.Context(), path, WriteOptions{Revision: 9, CompactRev: 9}, feed(rows))
	if err != nil {
		t.Fatal(err)
	}
	if info.Revision != 9 || info.CompactRev != 9 || info.TotalKeys != 2 {
		t.Fatalf("Info = %+v, want revision 9, compacted at 9, 2 keys", info)
	}

	empty := filepath.Join(t.TempDir(), "empty.db")
	info, err = Write(t.Context(), empty, WriteOptions{}, feed(nil))
	if err != nil {
		t.Fatal(err)
	}
	if info.Revision != 1 || info.TotalKeys != 0 || info.CompactRev != 0 {
		t.Fatalf("empty snapshot's Info = %+v, want revision 1 as a fresh etcd", info)
	}
}

func kv(key string, create, mod, version int64, value string) (m etcdfmt.KeyValue) {
	m.Key, m.CreateRevision, m.ModRevision, m.Version, m.Value = []byte(key), create, mod, version, []byte(value)
	return m
}

func TestWriteRejects(t *testing.T) {
	a := etcdfmt.Entry{Rev: etcdfmt.Revision{Main: 2}, KV: kv("a", 2, 2, 1, "x")}
	b := etcdfmt.Entry{Rev: etcdfmt.Revision{Main: 3}, KV: kv("b", 3, 3, 1, "y")}
	b2 := b
	b2.KV.Key = []byte("b2")
	noKey := etcdfmt.Entry{Rev: etcdfmt.Revision{Main: 4}, KV: kv("", 4, 4, 1, "z")}
	badMod := etcdfmt.Entry{Rev: etcdfmt.Revision{Main: 4}, KV: kv("c", 4, 5, 1, "z")}
	for _, tc := range []struct {
		name string
		rows []etcdfmt.Entry
		opts WriteOptions
		want string
	}{
		{"out of order", []etcdfmt.Entry{b, a}, WriteOptions{}, "revision order"},
		{"duplicate revision", []etcdfmt.Entry{a, b, b2}, WriteOptions{}, `revision 3/0 holds two rows, keys "b" and "b2"`},
		{"empty key", []etcdfmt.Entry{a, noKey}, WriteOptions{}, "empty key"},
		{"mod revision", []etcdfmt.Entry{a, badMod}, WriteOptions{}, "mod_revision 5"},
		{"revision below rows", []etcdfmt.Entry{a, b}, WriteOptions{Revision: 2}, "revision 2"},
		{"duplicate lease", []etcdfmt.Entry{a}, WriteOptions{Leases: []etcdfmt.Lease{{ID: 1}, {ID: 1}}}, "lease 1 given twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "snap.db")
			_, err := Write(t.Context(), path, tc.opts, feed(tc.rows))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Write = %v, want an error containing %q", err, tc.want)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Fatalf("failed Write left %s: %v", path, err)
			}
		})
	}

	t.Run("error yield returned is dropped", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "snap.db")
		_, err := Write(t.Context(), path, WriteOptions{}, func(yield func(*etcdfmt.Entry) error) error {
			_ = yield(&b)
			_ = yield(&a)
			return nil
		})
		if err == nil || !strings.Contains(err.Error(), "revision order") {
			t.Fatalf("Write = %v, want the order error", err)
		}
	})

	t.Run("rows fail", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "snap.db")
		errStop := errors.New("export failed")
		_, err := Write(t.Context(), path, WriteOptions{}, func(func(*etcdfmt.Entry) error) error { return errStop })
		if !errors.Is(err, errStop) {
			t.Fatalf("Write = %v, want %v", err, errStop)
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Fatalf("failed Write left %s: %v", path, err)
		}
	})

	t.Run("context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := Write(ctx, filepath.Join(t.TempDir(), "snap.db"), WriteOptions{}, feed([]etcdfmt.Entry{a}))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Write = %v, want %v", err, context.Canceled)
		}
	})

	t.Run("file exists", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "snap.db")
		if err := os.WriteFile(path, []byte("mine"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Write(t.Context(), path, WriteOptions{}, feed(nil)); !errors.Is(err, os.ErrExist) {
			t.Fatalf("Write over an existing file = %v, want %v", err, os.ErrExist)
		}
		if b, _ := os.ReadFile(path); string(b) != "mine" {
			t.Fatalf("Write touched an existing file: %q", b)
		}
	})
}

func TestOpenErrors(t *testing.T) {
	src, _, _, _ := writeHistory(t, 300, 2000, nil)
	dir := t.TempDir()
	mk := func(name string, edit func([]byte) []byte) string {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, edit(b), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	withTrailer := func(b []byte) []byte {
		sum := sha256.Sum256(b)
		return append(b, sum[:]...)
	}
	random := make([]byte, 64<<10)
	rng := rand.New(rand.NewPCG(9, 9))
	for i := range random {
		random[i] = byte(rng.Uint32())
	}

	for _, tc := range []struct {
		name string
		path string
		skip bool
		want error
	}{
		{"random bytes", mk("random", func([]byte) []byte { return random }), true, ErrNotBolt},
		{"random bytes with a trailer", mk("random-trailer", func([]byte) []byte { return withTrailer(random) }), false, ErrNotBolt},
		{"empty", mk("empty", func([]byte) []byte { return nil }), true, ErrNotBolt},
		{"cut in the middle", mk("cut", func(b []byte) []byte { return b[:len(b)/2] }), true, ErrTruncated},
		{"cut, hash check on", mk("cut2", func(b []byte) []byte { return b[:len(b)/2] }), false, ErrTruncated},
		{"cut with its trailer", mk("cut-trailer", func(b []byte) []byte { return withTrailer(b)[:len(b)/2+32] }), false, ErrTruncated},
		{"meta page only", mk("meta-only", func(b []byte) []byte { return b[:4096] }), true, ErrTruncated},
		{"corrupted byte", mk("corrupt", func(b []byte) []byte {
			b = withTrailer(b)
			b[len(b)/2] ^= 0xff
			return b
		}), false, ErrHashMismatch},
		{"corrupted trailer", mk("corrupt-trailer", func(b []byte) []byte {
			b = withTrailer(b)
			b[len(b)-1] ^= 1
			return b
		}), false, ErrHashMismatch},
		{"no trailer", src, false, ErrNoTrailer},
		{"no meta bucket", boltFile(t, dir, "no-meta", "key", "lease"), true, ErrNoMetaBucket},
		{"no key bucket", boltFile(t, dir, "no-key", "meta", "lease"), true, ErrNoKeyBucket},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Open(tc.path, OpenOptions{SkipHashCheck: tc.skip})
			if !errors.Is(err, tc.want) {
				if f != nil {
					f.Close()
				}
				t.Fatalf("Open = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.path) {
				t.Errorf("error %q does not name the file", err)
			}
			t.Log(err)
		})
	}

	t.Run("missing file", func(t *testing.T) {
		if _, err := Open(filepath.Join(dir, "nope"), OpenOptions{}); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Open = %v, want %v", err, os.ErrNotExist)
		}
	})

	t.Run("malformed row", func(t *testing.T) {
		p := boltFile(t, dir, "malformed", "key", "meta")
		db, err := bolt.Open(p, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		bad := etcdfmt.AppendBucketKey(nil, etcdfmt.Revision{Main: 2}, false)
		if err := db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(etcdfmt.BucketKey).Put(bad, []byte("\xff\xff"))
		}); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		_, err = Open(p, OpenOptions{SkipHashCheck: true})
		if !errors.Is(err, etcdfmt.ErrMalformed) || !strings.Contains(err.Error(), "00000000000000025f0000000000000000") {
			t.Fatalf("Open = %v, want %v naming the bucket key", err, etcdfmt.ErrMalformed)
		}
	})
}

// boltFile makes a bbolt file holding the named empty buckets.
func boltFile(t *testing.T, dir, name string, buckets ...string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	db, err := bolt.Open(p, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range buckets {
			if _, err := tx.CreateBucket([]byte(b)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestEntriesCallback(t *testing.T) {
	path, _, _, _ := writeHistory(t, 3000, 10, nil)
	f, err := Open(path, OpenOptions{SkipHashCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	errStop := errors.New("stop")
	if err := f.Entries(t.Context(), func(*etcdfmt.Entry) error { return errStop }); err != errStop {
		t.Fatalf("Entries = %v, want the callback's error as it is", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	n := 0
	err = f.Entries(ctx, func(*etcdfmt.Entry) error {
		if n++; n == 10 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) || n > ctxCheckEvery+1 {
		t.Fatalf("Entries after cancel = %v after %d rows, want %v soon", err, n, context.Canceled)
	}
	func() {
		defer func() {
			if r := recover(); r != "callback panic" {
				t.Fatalf("recovered %v, want the callback's panic passed on", r)
			}
		}()
		_ = f.Entries(t.Context(), func(*etcdfmt.Entry) error { panic("callback panic") })
	}()
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkWrite writes a million 512-byte objects, one revision each
// (-short: 10,000), and reports the file size per row.
func BenchmarkWrite(b *testing.B) {
	n := 1_000_000
	if testing.Short() {
		n = 10_000
	}
	value := bytes.Repeat([]byte("v"), 512)
	key := make([]byte, 0, 64)
	b.ReportAllocs()
	var size int64
	for b.Loop() {
		path := filepath.Join(b.TempDir(), "snap.db")
		info, err := Write(b.Context(), path, WriteOptions{}, func(yield func(*etcdfmt.Entry) error) error {
			var e etcdfmt.Entry
			for i := range n {
				rev := int64(i + 2)
				key = strconv.AppendInt(append(key[:0], "/registry/pods/default/pod-"...), rev, 10)
				e = etcdfmt.Entry{Rev: etcdfmt.Revision{Main: rev}, KV: etcdfmt.KeyValue{Key: key, Value: value, ModRevision: rev, CreateRevision: rev, Version: 1}}
				if err := yield(&e); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		size = info.TotalSize
	}
	b.ReportMetric(float64(size)/float64(n), "file-bytes/row")
}
