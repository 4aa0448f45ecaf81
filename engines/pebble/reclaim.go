package pebble

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/engramkv/engram/core/kv"
)

// Bounds of a compaction of the whole keyspace: keys are non-empty, so none
// sorts before a lone zero byte, and none is longer than kv.MaxKeySize, so
// none sorts after this run of 0xff bytes.
var (
	firstKey = []byte{0}
	lastKey  = bytes.Repeat([]byte{0xff}, kv.MaxKeySize+1)
)

// Reclaim is kv.Reclaimer (etcd's Defragment): it compacts the whole
// keyspace into the bottom level, flushing the memtables first, so that
// deletes drop the versions they hide and then themselves, and the space of
// deleted keys comes back now rather than when pebble's own compactions
// reach it. Pebble compacts by itself as levels fill, and it picks tables
// dense with deletes, so this is only what `etcdctl defrag` asks for.
//
// Commits, reads and iterators go on throughout (an iterator opened before
// keeps the tables it reads until it is closed). ctx is checked before the
// compaction starts and handed to pebble.
func (s *Store) Reclaim(ctx context.Context) error {
	if err := s.gate.Enter(); err != nil {
		return err
	}
	defer s.gate.Exit()
	s.reclaimMu.Lock()
	defer s.reclaimMu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	start := time.Now()
	before, _ := s.sizeLocked()
	// One compaction at a time: the cores are shared with the server's
	// requests.
	if err := s.db.Compact(ctx, firstKey, lastKey, false); err != nil {
		return fmt.Errorf("pebble: reclaim: compact: %w", err)
	}
	after, _ := s.sizeLocked()
	s.log.Info("reclaimed deleted space", "took", time.Since(start).Round(time.Millisecond), "size before", before, "size after", after)
	return nil
}
