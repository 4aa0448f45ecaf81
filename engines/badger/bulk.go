package badger

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	badgerdb "github.com/dgraph-io/badger/v3"
	"github.com/dgraph-io/badger/v3/pb"
	"github.com/dgraph-io/ristretto/z"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/internal/periodic"
)

// Bulk loading (kv.BulkLoader) writes sorted pairs with badger's
// StreamWriter: straight into tables at the bottom level, with no memtable,
// no write-ahead log and no compaction, which is what makes a restore into
// an empty store several times faster than Commit.
//
// The StreamWriter is not atomic: it adds each table to badger's manifest
// as it finishes it, so a crash leaves the tables written so far. The
// caller's marker must then be readable, but the marker's key sorts among
// the loaded keys, and tables of one level may not overlap. So the marker
// waits in a file beside the database, fsynced before the first table is
// written and removed only after the StreamWriter's last table and the
// directory are synced; Open finding the file discards the tables of the
// unfinished load and writes the marker into the database in their place,
// so the store holds the marker alone, as the contract asks.

// loadMarkerFile is the file that holds an unfinished load's marker.
const loadMarkerFile = "ENGRAM-BULK-LOAD"

// loadBufferBytes is how many bytes of pairs go to the StreamWriter in one
// Write.
const loadBufferBytes = 4 << 20

func newLoadBuffer() *z.Buffer { return z.NewBuffer(loadBufferBytes+(1<<20), "engram.BulkLoad") }

// releaseInterval is how often a load releases its tables' resident pages
// (releaseTablePages). Badger copies each table into a fresh shared
// mapping and msyncs it at once, and msync cleans every page still mapped
// one at a time, each with an interrupt to flush the other cores' TLBs: 13%
// of a million-object restore's CPU. Released often enough, most of a
// table's pages are gone from the mapping before its msync reaches them,
// and the page cache writes them back with no interrupt (DESIGN.md, "Bulk
// restore").
const releaseInterval = 10 * time.Millisecond

var _ kv.BulkLoader = (*Store)(nil)

// BulkLoad starts a load with badger's StreamWriter (see the comment above
// for how the marker survives a crash).
func (s *Store) BulkLoad(ctx context.Context, marker kv.Pair) (kv.Load, error) {
	if len(marker.Key) == 0 || len(marker.Key) > MaxKeySize {
		return nil, fmt.Errorf("badger: bulk load: marker key of %d bytes", len(marker.Key))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.gate.Lock()
	defer s.gate.Unlock()
	if err := s.usable(); err != nil {
		return nil, err
	}
	if err := s.checkLoadable(marker.Key); err != nil {
		return nil, err
	}
	if !s.inMemory {
		if err := writeLoadMarker(s.db.Opts().Dir, marker); err != nil {
			return nil, err
		}
	}
	sw := s.db.NewStreamWriter()
	// Prepare drops everything, an unfinished load's marker included:
	// the file now stands for it.
	if err := sw.Prepare(); err != nil {
		sw.Cancel()
		return nil, fmt.Errorf("badger: bulk load: prepare: %w", err)
	}
	l := &bulkLoad{store: s, sw: sw, marker: bytes.Clone(marker.Key), markerValue: bytes.Clone(marker.Value), buf: newLoadBuffer(), writer: startLoadWriter(sw)}
	l.startReleaser()
	s.load = l
	return l, nil
}

// checkLoadable refuses a store holding a data key other than marker.
func (s *Store) checkLoadable(marker []byte) error {
	return s.db.View(func(txn *badgerdb.Txn) error {
		it := txn.NewIterator(badgerdb.IteratorOptions{Prefix: []byte{dataPrefix}})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			if k := it.Item().Key()[1:]; !bytes.Equal(k, marker) {
				return fmt.Errorf("badger: bulk load: %w: it holds key %q", kv.ErrNotEmpty, k)
			}
		}
		return nil
	})
}

// usable says why the store cannot serve a call, nil when it can. The
// caller holds the gate.
func (s *Store) usable() error {
	switch {
	case s.closed:
		return kv.ErrClosed
	case s.load != nil:
		return kv.ErrLoading
	}
	return nil
}

// cancelLoadLocked stops the load in progress, if any; the caller holds the
// gate exclusively.
func (s *Store) cancelLoadLocked() {
	if s.load != nil {
		// The writer's Write must end before the StreamWriter is
		// cancelled; its error no longer matters.
		_ = s.load.writer.stop()
		s.load.releaser.Stop()
		if !s.load.flushed {
			s.load.sw.Cancel()
		}
		s.load.release()
		s.load = nil
	}
}

// bulkLoad is a kv.Load over a StreamWriter.
type bulkLoad struct {
	store       *Store
	sw          *badgerdb.StreamWriter
	marker      []byte
	markerValue []byte
	// buf is the buffer AddTo fills; writer writes the full ones.
	buf     *z.Buffer
	writer  *loadWriter
	order   kv.LoadOrder
	kv      pb.KV
	key     []byte
	flushed bool
	// releaser releases the tables' pages every releaseInterval until
	// the StreamWriter is flushed or cancelled (nil in memory).
	releaser *periodic.Task
}

func (l *bulkLoad) Add(ctx context.Context, pairs []kv.Pair) error { return l.AddTo(ctx, 0, pairs) }

// AddTo hands the pairs to StreamWriter stream stream+1 (badger's stream 0
// is not usable): each stream builds its own tables, so the load's streams
// need not be merged into one order.
func (l *bulkLoad) AddTo(ctx context.Context, stream int, pairs []kv.Pair) error {
	// The shared gate keeps Close from stopping the writer while a buffer
	// is handed to it.
	l.store.gate.RLock()
	defer l.store.gate.RUnlock()
	if err := l.activeLocked(); err != nil {
		return err
	}
	for _, p := range pairs {
		if len(p.Key) == 0 || len(p.Key) > MaxKeySize || len(p.Value) > kv.MaxValueSize {
			return fmt.Errorf("badger: bulk load: key of %d bytes, value of %d", len(p.Key), len(p.Value))
		}
		if bytes.Equal(p.Key, l.marker) {
			return fmt.Errorf("badger: bulk load: a pair names the marker key %q", p.Key)
		}
		if err := l.order.Check(stream, p.Key); err != nil {
			return fmt.Errorf("badger: %w", err)
		}
		// Version 1 for every key: the StreamWriter sets badger's clock
		// past the highest version it wrote, so later commits shadow it.
		// KVToBuffer copies the pair: one key buffer serves them all.
		l.key = append(append(l.key[:0], dataPrefix), p.Key...)
		l.kv = pb.KV{Key: l.key, Value: p.Value, Version: 1, StreamId: uint32(stream) + 1}
		badgerdb.KVToBuffer(&l.kv, l.buf)
		if l.buf.LenNoPadding() >= loadBufferBytes {
			if err := l.write(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// write hands the full buffer to the writer and takes an empty one.
func (l *bulkLoad) write(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var err error
	l.buf, err = l.writer.swap(l.buf)
	return err
}

// startReleaser releases the load's tables' pages now and then; it must be
// stopped before the StreamWriter is flushed (Flush resumes compactions,
// which close tables) or cancelled.
func (l *bulkLoad) startReleaser() {
	s := l.store
	if s.inMemory {
		return
	}
	dir := s.db.Opts().Dir
	warned := false
	l.releaser = periodic.Start(releaseInterval, func(context.Context) {
		if err := releaseTablePages(dir); err != nil && !warned {
			// Only memory is at stake: the pages stay resident.
			s.log.Warn("bulk load: releasing the tables' pages failed", "err", err)
			warned = true
		}
	})
}

// activeLocked fails once the load ended or the store was closed; the
// caller holds the gate.
func (l *bulkLoad) activeLocked() error {
	s := l.store
	if s.closed || s.load != l {
		return errors.New("badger: bulk load: the load ended (finished, aborted, or the store closed)")
	}
	return nil
}

func (l *bulkLoad) Finish(ctx context.Context) error {
	// Tables of one level must not overlap: the StreamWriter would
	// register them anyway.
	if err := l.order.Disjoint(); err != nil {
		return fmt.Errorf("badger: %w", err)
	}
	if err := l.flush(ctx); err != nil {
		return err
	}
	s := l.store
	s.gate.Lock()
	defer s.gate.Unlock()
	if s.load != l {
		return errors.New("badger: bulk load: the store was closed before the load finished")
	}
	s.load = nil
	l.release()
	if !s.inMemory {
		// The tables and the directory are synced (Flush): only now
		// may the marker go.
		if err := removeLoadMarker(s.db.Opts().Dir); err != nil {
			return err
		}
	}
	return nil
}

// flush writes the last pairs and has the StreamWriter finish its tables.
func (l *bulkLoad) flush(ctx context.Context) error {
	s := l.store
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := l.activeLocked(); err != nil {
		return err
	}
	if err := l.write(ctx); err != nil {
		return err
	}
	if err := l.writer.stop(); err != nil {
		return err
	}
	l.releaser.Stop()
	// A flushed StreamWriter must not be cancelled (its throttle would be
	// finished twice): Close after this point leaves the marker file, and
	// the next Open discards the load.
	l.flushed = true
	if err := l.sw.Flush(); err != nil {
		return fmt.Errorf("badger: bulk load: flush: %w", err)
	}
	return nil
}

func (l *bulkLoad) Abort() error {
	s := l.store
	s.gate.Lock()
	defer s.gate.Unlock()
	if s.load != l {
		return nil
	}
	s.cancelLoadLocked()
	// The tables written so far stay; the marker goes into the database
	// so that the store says it is unfinished without a restart.
	return markUnfinished(s.db, l.marker, l.markerValue)
}

// release frees the load's buffers; the writer has stopped.
func (l *bulkLoad) release() {
	if l.buf != nil {
		_ = l.buf.Release()
		l.buf = nil
	}
	l.writer.release()
}

// markUnfinished writes the marker into db, durably (SyncWrites).
func markUnfinished(db *badgerdb.DB, key, value []byte) error {
	err := db.Update(func(txn *badgerdb.Txn) error {
		return txn.Set(dataKey(key), bytes.Clone(value))
	})
	if err != nil {
		return fmt.Errorf("badger: bulk load: write the marker: %w", err)
	}
	return nil
}

// writeLoadMarker writes the marker file: key length, key, value.
func writeLoadMarker(dir string, marker kv.Pair) error {
	b := binary.AppendUvarint(nil, uint64(len(marker.Key)))
	b = append(b, marker.Key...)
	b = append(b, marker.Value...)
	return changeLoadMarker(dir, "write", func(path string) error {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		if _, err := f.Write(b); err != nil {
			_ = f.Close()
			return err
		}
		return syncAndClose(f)
	})
}

func removeLoadMarker(dir string) error {
	return changeLoadMarker(dir, "remove", os.Remove)
}

// changeLoadMarker makes change (what, for the error) to the marker file
// in dir, then syncs dir so that the change outlives a crash.
func changeLoadMarker(dir, what string, change func(path string) error) error {
	path := filepath.Join(dir, loadMarkerFile)
	err := change(path)
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("badger: bulk load: %s %s: %w", what, path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return syncAndClose(d)
}

// syncAndClose syncs f and closes it, returning the first error.
func syncAndClose(f *os.File) error {
	err := f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// recoverUnfinishedLoad runs at Open: a marker file means a load stopped
// before it finished. Its tables are dropped and the marker written into
// the database, then the file removed; a crash meanwhile repeats this.
func recoverUnfinishedLoad(db *badgerdb.DB, dir string) (bool, error) {
	path := filepath.Join(dir, loadMarkerFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("badger: open: %w", err)
	}
	raw, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		return false, fmt.Errorf("badger: open: read %s: %w", path, err)
	}
	n, w := binary.Uvarint(raw)
	if w <= 0 || uint64(len(raw)-w) < n || n == 0 {
		return false, fmt.Errorf("badger: open: %s is corrupt; it marks a bulk load that did not finish: remove the database and load again", path)
	}
	key, value := raw[w:w+int(n)], raw[w+int(n):]
	if err := db.DropAll(); err != nil {
		return false, fmt.Errorf("badger: open: discard the unfinished bulk load: %w", err)
	}
	if err := markUnfinished(db, key, value); err != nil {
		return false, fmt.Errorf("badger: open: %w", err)
	}
	if err := removeLoadMarker(dir); err != nil {
		return false, fmt.Errorf("badger: open: %w", err)
	}
	return true, nil
}
