// Package pebble is an embedded, durable kv.Store built on
// github.com/cockroachdb/pebble/v2, an alternative to the badger engine that
// keeps the engine's memory small and bounded.
//
// It owns the mapping of the kv contract onto one pebble database: durable
// group commit, snapshot iteration, the engine's memory settings and space
// reclamation on request. It must not interpret keys or values (revisions,
// leases and MVCC belong to the core), must not expose pebble types, and
// must not let pebble's error vocabulary leak out: callers see only the
// errors of package kv, wrapped with context.
//
// # Memory
//
// Pebble reads tables with pread through its own block cache, so the
// operating system's page cache of the tables is not mapped into the
// process (badger maps every table it writes, and all of it counts in the
// resident set); its memtables and block cache are allocated outside the Go
// heap and bounded by Options (DESIGN.md, "The pebble engine").
//
// # Writes
//
// Every Commit goes to one committer goroutine, which takes all batches
// queued while the previous group was being written, evaluates their
// conditions in arrival order against the database plus the group's earlier
// batches, and applies the batches that hold as one pebble batch: one WAL
// write, one fsync. A batch whose condition fails contributes nothing and
// does not affect the others. Because the committer is pebble's only writer,
// it can prove most conditions from digests of what it last wrote, without
// reading pebble (package condcache). Pebble has no transaction size limit that the
// core can reach (a batch larger than half a memtable becomes a memtable of
// its own), so a group is cut only to bound its latency.
//
// # Reads
//
// Get reads the newest committed state. Scan opens a pebble iterator, which
// reads at the sequence number current when it was opened: that is the
// snapshot. An open iterator pins the memtables and tables it reads until it
// is exhausted or closed.
package pebble

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	pebbledb "github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/batchiter"
	"github.com/engramkv/engram/engines/internal/compression"
	"github.com/engramkv/engram/engines/internal/condcache"
	"github.com/engramkv/engram/engines/internal/diskuse"
	"github.com/engramkv/engram/engines/internal/gate"
	"github.com/engramkv/engram/engines/internal/groupcommit"
)

// Defaults of Options (DESIGN.md, "The pebble engine").
const (
	// DefaultCacheSize bounds the block cache: data, index and filter
	// blocks read from tables. The core's latest-record cache answers most
	// reads of current objects before they reach the engine.
	DefaultCacheSize = 64 << 20
	// DefaultMemTableSize is the largest memtable. Pebble starts with a
	// small one and doubles it at each rotation up to this size. 16 MiB
	// loaded a million objects as fast as 32 MiB, in less memory and disk
	// (each WAL file is preallocated at 110% of it).
	DefaultMemTableSize = 16 << 20
	// memtableStopWrites is how many memtables (the one written and those
	// waiting to be flushed) may exist before writes wait for a flush:
	// pebble's default.
	memtableStopWrites = 2
	// bloomBitsPerKey sizes the tables' bloom filters: about 1% false
	// positives for 1.25 bytes a key. Without them, a read of a key that
	// does not exist (every create's put-if-absent) reads an index and a
	// data block of every level the key could be in (DESIGN.md, "The pebble
	// engine").
	bloomBitsPerKey = 10
)

const (
	// maxGroup caps the batches applied as one pebble batch, and maxGroupBytes
	// their size, which bounds the latency the last batch of a group adds to
	// the first.
	maxGroup      = 1024
	maxGroupBytes = 32 << 20
)

// Options configures Open.
type Options struct {
	// Dir holds the database. Required.
	Dir string
	// Logger receives pebble's errors (its informational messages at debug
	// level). Nil discards them.
	Logger *slog.Logger
	// CacheSize is the block cache in bytes; 0 means DefaultCacheSize.
	CacheSize int64
	// MemTableSize is the largest memtable in bytes; 0 means
	// DefaultMemTableSize. At most two memtables (one written, one being
	// flushed) exist before writes wait for a flush.
	MemTableSize int64
	// Compression is how table blocks are compressed: "none" (or empty),
	// "snappy" or "zstd". Each table records its own, so a store can be
	// reopened with another setting.
	Compression string
	// ConditionCacheEntries bounds how many recently written keys the
	// committer remembers to check conditions without reading pebble
	// (package condcache); 0 means 131072 (about 25 MiB), negative disables
	// it.
	ConditionCacheEntries int
}

// Compressions are the values Options.Compression takes.
var Compressions = compression.Names

func compressionProfile(name string) (*sstable.CompressionProfile, error) {
	return compression.Choose(name, sstable.NoCompression, sstable.SnappyCompression, sstable.ZstdCompression)
}

// Store is the pebble adaptor. It is safe for concurrent use.
type Store struct {
	db  *pebbledb.DB
	dir string
	log *slog.Logger

	// gate is held shared by every call that touches the engine and
	// exclusively by Close, so Close waits for in-flight calls (including
	// Commits waiting for their group's fsync) and nothing touches the
	// engine after it is closed (pebble panics on a closed DB).
	gate gate.Gate

	// queue carries Commits to the committer (commit.go).
	queue *groupcommit.Queue

	iters batchiter.Open

	// reclaimMu makes Reclaims one at a time.
	reclaimMu sync.Mutex

	stats groupcommit.Counters
}

var (
	_ kv.Store     = (*Store)(nil)
	_ kv.Sizer     = (*Store)(nil)
	_ kv.Reclaimer = (*Store)(nil)
)

// Open opens (creating if needed) the database in opts.Dir.
func Open(opts Options) (*Store, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("engine", "pebble")
	if opts.Dir == "" {
		return nil, errors.New("pebble: open: Dir is required")
	}
	if opts.CacheSize < 0 || opts.MemTableSize < 0 {
		return nil, fmt.Errorf("pebble: open: negative cache (%d) or memtable (%d) size", opts.CacheSize, opts.MemTableSize)
	}
	cacheSize := opts.CacheSize
	if cacheSize == 0 {
		cacheSize = DefaultCacheSize
	}
	memtable := opts.MemTableSize
	if memtable == 0 {
		memtable = DefaultMemTableSize
	}
	profile, err := compressionProfile(opts.Compression)
	if err != nil {
		return nil, fmt.Errorf("pebble: open: %w", err)
	}
	po := &pebbledb.Options{
		// Pebble charges its memtables to the block cache: a cache no
		// larger than the memtables caches nothing at all (every read
		// went to the file, DESIGN.md, "The pebble engine"). The cache
		// is sized for CacheSize of blocks beside the most memtables
		// that can exist before writes wait.
		CacheSize:                   cacheSize + memtableStopWrites*memtable,
		MemTableSize:                uint64(memtable),
		MemTableStopWritesThreshold: memtableStopWrites,
		// New stores get the newest stable format; an existing store is
		// ratcheted up to it.
		FormatMajorVersion: pebbledb.FormatNewest,
		Logger:             pebbleLogger{logger},
	}
	for i := range po.Levels {
		if bloomBitsPerKey > 0 {
			po.Levels[i].FilterPolicy = bloom.FilterPolicy(bloomBitsPerKey)
		}
		// No compression by default, as etcd and the badger engine:
		// decompressing every block read costs CPU on every cache miss.
		po.Levels[i].Compression = func() *sstable.CompressionProfile { return profile }
	}
	db, err := pebbledb.Open(opts.Dir, po)
	if err != nil {
		return nil, fmt.Errorf("pebble: open %q: %w", opts.Dir, err)
	}
	s := &Store{
		db:    db,
		dir:   opts.Dir,
		log:   logger,
		queue: groupcommit.NewQueue("pebble", maxGroup, maxGroupBytes),
	}
	entries := opts.ConditionCacheEntries
	if entries == 0 {
		entries = condcache.DefaultEntries
	}
	c := &committer{s: s, pending: make(map[string]written), conds: condcache.New(entries)}
	go s.queue.Run(c.commitGroup)
	return s, nil
}

// Features reports a durable engine without optional capabilities.
func (s *Store) Features() kv.Features {
	return kv.Features{Name: "pebble", Durable: true}
}

// Size reports the bytes the engine holds on disk (its files' allocated
// blocks, see package diskuse); Status reports it as DbSize and the quota
// counts it.
func (s *Store) Size() (int64, error) {
	if err := s.gate.Enter(); err != nil {
		return 0, err
	}
	defer s.gate.Exit()
	return s.sizeLocked()
}

// sizeLocked is Size for a caller holding the gate.
func (s *Store) sizeLocked() (int64, error) {
	n, err := diskuse.Allocated(s.dir)
	if err != nil {
		return 0, fmt.Errorf("pebble: size: %w", err)
	}
	return n, nil
}

// Stats counts the work of the committer since Open.
type Stats = groupcommit.Stats

// Stats returns the committer's counters.
func (s *Store) Stats() Stats { return s.stats.Stats() }

// Get returns a copy of key's value, or kv.ErrNotFound.
func (s *Store) Get(ctx context.Context, key []byte) ([]byte, error) {
	if err := s.gate.EnterKey(key); err != nil {
		return nil, err
	}
	defer s.gate.Exit()
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebbledb.ErrNotFound) {
		return nil, kv.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("pebble: get %q: %w", key, err)
	}
	out := make([]byte, len(v))
	copy(out, v)
	if err := closer.Close(); err != nil {
		return nil, fmt.Errorf("pebble: get %q: %w", key, err)
	}
	return out, nil
}

// Partitions returns the whole range: the core does not need split points
// at the sizes an embedded engine serves, so the feature is not declared.
func (s *Store) Partitions(ctx context.Context, start, end []byte) ([]kv.Range, error) {
	if err := s.gate.Enter(); err != nil {
		return nil, err
	}
	defer s.gate.Exit()
	return []kv.Range{{Start: bytes.Clone(start), End: bytes.Clone(end)}}, nil
}

// Close waits for in-flight calls and queued commits, releases open
// iterators and closes the database. Later calls return kv.ErrClosed.
func (s *Store) Close() error {
	return s.gate.Close(func() error {
		// No Commit holds the gate, so none is queued or waiting: closing
		// the queue lets the committer finish its last group and exit.
		s.queue.Close()

		s.iters.CloseAll()
		if err := s.db.Close(); err != nil {
			return fmt.Errorf("pebble: close: %w", err)
		}
		return nil
	})
}

// pebbleLogger routes pebble's logging into slog. Pebble reports routine
// progress at info level; that is debug for us. Fatalf must not return:
// pebble calls it when it cannot go on (a failed WAL write), and its
// state is unusable afterwards.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(f string, args ...any)  { p.emit(slog.LevelDebug, f, args) }
func (p pebbleLogger) Errorf(f string, args ...any) { p.emit(slog.LevelError, f, args) }
func (p pebbleLogger) Fatalf(f string, args ...any) {
	msg := strings.TrimSpace(fmt.Sprintf(f, args...))
	p.l.Error(msg, "fatal", true)
	panic("pebble: " + msg)
}

func (p pebbleLogger) emit(level slog.Level, f string, args []any) {
	ctx := context.Background()
	if !p.l.Enabled(ctx, level) {
		return // spare the Sprintf
	}
	p.l.Log(ctx, level, strings.TrimSpace(fmt.Sprintf(f, args...)))
}
