// Package badger is Engram's default embedded, durable kv.Store, built on
// github.com/dgraph-io/badger/v3.
//
// It owns the mapping of the kv contract onto one badger database: key
// encoding, durable group commit, snapshot iteration and the engine's
// housekeeping (value-log GC, logging). It must not interpret keys or
// values (revisions, leases and MVCC belong to the core), must not expose
// badger types, and must not let badger's own error vocabulary leak out:
// callers see only the errors of package kv, wrapped with context.
//
// # Writes
//
// Every Commit goes to one committer goroutine, which takes all batches
// queued while the previous group was being written and applies them in one
// badger transaction: one WAL write, one fsync. Badger's own write path
// cannot share fsyncs this way, because it syncs its WAL once per
// transaction even when it batches several into one write (BenchmarkBaseline;
// DESIGN.md, "Group commit"). Within a group, batches are evaluated in arrival
// order against the transaction's state, so each batch sees the batches
// before it; a batch whose condition fails contributes nothing and does not
// affect the others. Because there is a single writer, badger's optimistic
// conflict detection is switched off and ErrConflict cannot occur. For the
// same reason the committer can prove most conditions from digests of what
// it last wrote, without reading badger (package condcache).
//
// # Reads
//
// Get and Scan use read-only badger transactions, which are snapshots at
// the newest completed commit. An iterator pins its snapshot (and the
// versions and value-log files it needs) until it is exhausted or closed; a
// forgotten iterator delays compaction and value-log GC until Close.
// Forward scans read every version and apply the tombstone rules
// themselves, so that they stop at their end instead of walking a run of
// deleted keys behind it (iterator.go).
//
// # Bulk loading
//
// BulkLoad fills an empty store with badger's StreamWriter, table by table
// into the bottom level, each of the load's streams its own StreamWriter
// stream; the load's marker waits in a file beside the database until the
// load is synced (bulk.go), and the tables' mapped pages leave the resident
// set as the load goes (release_linux.go). Meanwhile every other call
// answers kv.ErrLoading.
package badger

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	badgerdb "github.com/dgraph-io/badger/v3"
	"github.com/dgraph-io/badger/v3/options"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/batchiter"
	"github.com/engramkv/engram/engines/internal/compression"
	"github.com/engramkv/engram/engines/internal/condcache"
	"github.com/engramkv/engram/engines/internal/diskuse"
	"github.com/engramkv/engram/engines/internal/groupcommit"
	"github.com/engramkv/engram/internal/periodic"
)

// Limits of this adaptor that are tighter than the kv contract's.
const (
	// MaxKeySize is the longest key the engine could store: badger refuses
	// keys over 65000 bytes (its table format stores key lengths in 16
	// bits, with room for an 8-byte version), and the adaptor spends one
	// byte on its namespace prefix. The contract's kv.MaxKeySize is below
	// it, so every key the core sends fits.
	MaxKeySize = 65000 - 1
	// MaxInMemoryValueSize is the largest value an InMemory store takes:
	// with no value log, values must stay below badger's 1 MiB value
	// threshold. (Badger v3 accepts a value of exactly the threshold and
	// then panics writing it, so the adaptor checks this itself.)
	MaxInMemoryValueSize = 1<<20 - 1
)

const (
	// dataPrefix namespaces every user key. Badger reserves keys starting
	// with "!badger!", which the contract requires us to accept; prefixing
	// makes every user key legal and sorts all of them after badger's
	// internal keys ('!' < 'd'), leaving other letters free for the
	// adaptor's own metadata later.
	dataPrefix = 'd'

	defaultBlockCacheSize = 64 << 20
	// Badger's defaults (five 64 MiB memtables, four compactors) hold much
	// of the live heap after a large load: skiplist arenas per memtable and
	// table-builder buffers that badger's allocator pool keeps. Smaller
	// memtables would save memory, but badger limits one transaction to 15%
	// of a memtable, which must still take a DeleteRange etcd takes in one
	// revision; so the memtable stays at 64 MiB (a 9.6 MiB transaction
	// limit) and only their number drops: three are enough for one being
	// written, one being flushed and one spare. (DESIGN.md, "Badger's
	// memory settings".)
	defaultMemTableSize = 64 << 20
	defaultNumMemtables = 3
	// numCompactors is badger's minimum (compactor 0 prioritises L0); its
	// default of 4 runs more table builders at once than two cores can
	// feed, and every builder leaves a buffer in the allocator pool.
	numCompactors         = 2
	defaultGCInterval     = 10 * time.Minute
	defaultGCDiscardRatio = 0.5
	// maxGCRounds bounds one GC pass, so Close never waits on a long GC.
	maxGCRounds = 8

	// maxGroup caps the batches merged into one badger transaction, which
	// bounds the latency the last batch of a group adds to the first.
	maxGroup = 1024
)

// Options configures Open.
type Options struct {
	// Dir holds the database. Required unless InMemory is set.
	Dir string
	// InMemory keeps everything in memory, for tests; nothing is durable
	// and values are limited to MaxInMemoryValueSize.
	InMemory bool
	// Logger receives badger's warnings and errors (its info and debug
	// chatter at debug level). Nil discards them.
	Logger *slog.Logger
	// GCInterval is the pause between value-log GC passes; 0 means ten
	// minutes and a negative value disables GC.
	GCInterval time.Duration
	// Compression is how table blocks are compressed: "none" (or empty),
	// "snappy" or "zstd". Each table records its own, so a store can be
	// reopened with another setting; tables are rewritten with it as
	// compaction reaches them.
	Compression string
	// BlockCacheSize bounds the cache of decompressed table blocks; 0
	// means none without compression (blocks are read in place from the
	// memory-mapped tables) and 64 MiB with it.
	BlockCacheSize int64
	// MemTableSize is the size of one memtable; 0 means 64 MiB. Each
	// memtable is a Go-heap arena of about 1.3 times this size, and the
	// table builder that flushes it grows a buffer of up to twice this size
	// (raw blocks in doubling steps, plus a compressed copy of each when
	// compressing) that badger's allocator pool keeps afterwards. The
	// builders of compaction, which memtables do not size, hold as much, so
	// smaller memtables do not lower RSS after a large load (DESIGN.md,
	// "Badger's memory settings"). It also caps one atomic Commit at 15% of
	// it (badger's transaction limit; 9.6 MiB at 64 MiB, about 12000 keys of
	// one DeleteRange).
	MemTableSize int64
	// NumMemtables is how many memtables (the one being written and those
	// waiting to be flushed) may exist before writes wait for a flush; 0
	// means 3.
	NumMemtables int
	// ConditionCacheEntries bounds how many recently written keys the
	// committer remembers to check conditions without reading badger
	// (package condcache); 0 means 131072 (about 25 MiB), negative disables
	// it.
	ConditionCacheEntries int
}

func condEntries(n int) int {
	if n == 0 {
		return condcache.DefaultEntries
	}
	return n // negative: condcache.New returns nil
}

// Store is the badger adaptor. It is safe for concurrent use.
type Store struct {
	db       *badgerdb.DB
	log      *slog.Logger
	inMemory bool

	// Badger's per-transaction limits, read once at Open; the committer
	// cuts groups so that no transaction exceeds them.
	maxTxnSize     int64
	maxTxnCount    int64
	valueThreshold int64

	// gate is held shared by every call that touches the engine and
	// exclusively by Close, so Close waits for in-flight calls (including
	// Commits waiting for their group's fsync) and nothing touches the
	// engine after it is closed.
	gate   sync.RWMutex
	closed bool

	// conds is owned by the committer goroutine (package condcache).
	conds *condcache.Cache

	// queue carries Commits to the committer (commitGroup).
	queue *groupcommit.Queue

	// gc runs value-log GC (runGC); nil when off.
	gc *periodic.Task

	iters batchiter.Open

	reclaim reclaimer // reclaim.go

	// load is the bulk load in progress (bulk.go), guarded by gate: set
	// and cleared under the exclusive gate, read under the shared one.
	load *bulkLoad

	stats groupcommit.Counters
}

var _ kv.Store = (*Store)(nil)

// Open opens (creating if needed) the database described by opts.
func Open(opts Options) (*Store, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("engine", "badger")
	if opts.InMemory && opts.Dir != "" {
		return nil, errors.New("badger: open: InMemory and Dir are exclusive")
	}
	if !opts.InMemory && opts.Dir == "" {
		return nil, errors.New("badger: open: Dir is required unless InMemory is set")
	}
	tableCompression, err := ParseCompression(opts.Compression)
	if err != nil {
		return nil, fmt.Errorf("badger: open: %w", err)
	}
	cache := opts.BlockCacheSize
	if cache <= 0 && tableCompression != options.None {
		cache = defaultBlockCacheSize
	}
	memtable := opts.MemTableSize
	if memtable <= 0 {
		memtable = defaultMemTableSize
	}
	memtables := opts.NumMemtables
	if memtables <= 0 {
		memtables = defaultNumMemtables
	}
	bo := badgerdb.DefaultOptions(opts.Dir).
		WithInMemory(opts.InMemory).
		// Every acknowledged Commit must survive a crash; the committer
		// makes this affordable by sharing one sync per group.
		WithSyncWrites(true).
		// The core keeps its own MVCC history in keys; older badger
		// versions are garbage the moment they are overwritten.
		WithNumVersionsToKeep(1).
		// One goroutine writes, so optimistic conflict detection would only
		// cost memory (and ErrConflict must never reach callers).
		WithDetectConflicts(false).
		// No compression by default, as etcd. Badger allocates a
		// compressed copy of every block beside the raw one while it builds
		// a table and keeps both in its allocator pool, and compressed
		// blocks must be decompressed into a block cache to be read, so
		// compression costs far more memory and load rate than it saves
		// disk on a large load (DESIGN.md, "Badger's memory settings").
		// Kubernetes objects compress better than random bytes; operators
		// who would trade memory for disk choose snappy or zstd.
		WithCompression(tableCompression).
		WithBlockCacheSize(cache).
		WithMemTableSize(memtable).
		WithNumMemtables(memtables).
		WithNumCompactors(numCompactors).
		// Values up to the 1 MiB threshold live in the LSM tree, where
		// compaction reclaims them; only rare huge values reach the value
		// log, so it can use smaller files that GC can reclaim sooner.
		WithValueLogFileSize(256 << 20).
		// Badger's expvar metrics are process-global; the core exports
		// its own.
		WithMetricsEnabled(false).
		WithLogger(slogLogger{logger}).
		WithLoggingLevel(badgerdb.WARNING)
	db, err := badgerdb.Open(bo)
	if err != nil {
		return nil, fmt.Errorf("badger: open %q: %w", opts.Dir, err)
	}
	if !opts.InMemory {
		discarded, err := recoverUnfinishedLoad(db, opts.Dir)
		if err != nil {
			_ = db.Close()
			return nil, err
		}
		if discarded {
			logger.Warn("discarded the tables of a bulk load that did not finish; the store holds only its marker")
		}
	}
	s := &Store{
		db:             db,
		log:            logger,
		inMemory:       opts.InMemory,
		maxTxnSize:     db.MaxBatchSize(),
		maxTxnCount:    db.MaxBatchCount(),
		valueThreshold: bo.ValueThreshold,
		queue:          groupcommit.NewQueue("badger", maxGroup, 0),
		conds:          condcache.New(condEntries(opts.ConditionCacheEntries)),
	}
	go s.queue.Run(s.commitGroup)
	interval := opts.GCInterval
	if interval == 0 {
		interval = defaultGCInterval
	}
	if interval > 0 && !opts.InMemory {
		s.gc = periodic.Start(interval, s.runGC)
	}
	s.startReclaim(interval > 0) // reclaim.go; off with GC
	return s, nil
}

// Features reports a durable engine without optional capabilities.
func (s *Store) Features() kv.Features {
	return kv.Features{Name: "badger", Durable: true}
}

// Size reports the bytes the engine holds on disk (its files' allocated
// blocks, see package diskuse); Status reports it as DbSize and the quota
// counts it. An in-memory store reports 0.
func (s *Store) Size() (int64, error) {
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := s.usable(); err != nil {
		return 0, err
	}
	if s.inMemory {
		return 0, nil
	}
	n, err := diskuse.Allocated(s.db.Opts().Dir)
	if err != nil {
		return 0, fmt.Errorf("badger: size: %w", err)
	}
	return n, nil
}

var _ kv.Sizer = (*Store)(nil)

// Stats counts the work of the committer since Open.
type Stats = groupcommit.Stats

// Stats returns the committer's counters.
func (s *Store) Stats() Stats { return s.stats.Stats() }

// dataKey returns key in the adaptor's namespace.
func dataKey(key []byte) []byte {
	k := make([]byte, 1+len(key))
	k[0] = dataPrefix
	copy(k[1:], key)
	return k
}

// Get returns a copy of key's value, or kv.ErrNotFound.
func (s *Store) Get(ctx context.Context, key []byte) ([]byte, error) {
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := s.usable(); err != nil {
		return nil, err
	}
	if len(key) == 0 || len(key) > MaxKeySize {
		return nil, kv.ErrNotFound // no such key can have been stored
	}
	txn := s.db.NewTransaction(false)
	defer txn.Discard()
	item, err := txn.Get(dataKey(key))
	if errors.Is(err, badgerdb.ErrKeyNotFound) {
		return nil, kv.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("badger: get %q: %w", key, err)
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return nil, fmt.Errorf("badger: get %q: read value: %w", key, err)
	}
	if v == nil {
		v = []byte{}
	}
	return v, nil
}

// Partitions returns the whole range: badger's table boundaries could
// provide split points, but the core does not need them at the sizes an
// embedded engine serves, so the feature is not declared.
func (s *Store) Partitions(ctx context.Context, start, end []byte) ([]kv.Range, error) {
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := s.usable(); err != nil {
		return nil, err
	}
	return []kv.Range{{Start: bytes.Clone(start), End: bytes.Clone(end)}}, nil
}

// Close waits for in-flight calls and queued commits, stops GC, releases
// open iterators and closes the database. Later calls return kv.ErrClosed.
func (s *Store) Close() error {
	// A reclamation holds the gate shared and cannot be interrupted; stop
	// the loop first so that none starts while Close waits for the gate.
	s.stopReclaim()
	s.gate.Lock()
	defer s.gate.Unlock()
	if s.closed {
		return kv.ErrClosed
	}
	s.closed = true
	// A load that did not finish stops here, its marker file in place
	// (bulk.go).
	s.cancelLoadLocked()
	// No Commit holds the gate, so none is queued or waiting: closing the
	// queue lets the committer finish its last group and exit.
	s.queue.Close()
	s.gc.Stop()

	s.iters.CloseAll()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("badger: close: %w", err)
	}
	return nil
}

// runGC reclaims value-log space left by overwritten large values, up to
// maxGCRounds rewrites until one finds nothing worth rewriting.
func (s *Store) runGC(ctx context.Context) {
	for range maxGCRounds {
		err := s.db.RunValueLogGC(defaultGCDiscardRatio)
		if err != nil {
			// ErrNoRewrite: nothing worth rewriting; ErrRejected: a GC is
			// already running or the DB is closing.
			if !errors.Is(err, badgerdb.ErrNoRewrite) && !errors.Is(err, badgerdb.ErrRejected) {
				s.log.Warn("value log GC failed", "err", err)
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// slogLogger routes badger's logging into slog. Badger logs routine
// progress (compactions, flushes) at info level; that is debug for us.
type slogLogger struct{ l *slog.Logger }

func (b slogLogger) Errorf(f string, args ...any)   { b.emit(slog.LevelError, f, args) }
func (b slogLogger) Warningf(f string, args ...any) { b.emit(slog.LevelWarn, f, args) }
func (b slogLogger) Infof(f string, args ...any)    { b.emit(slog.LevelDebug, f, args) }
func (b slogLogger) Debugf(f string, args ...any)   { b.emit(slog.LevelDebug, f, args) }

func (b slogLogger) emit(level slog.Level, f string, args []any) {
	ctx := context.Background()
	if !b.l.Enabled(ctx, level) {
		return // spare the Sprintf
	}
	b.l.Log(ctx, level, strings.TrimSpace(fmt.Sprintf(f, args...)))
}

// Compressions are the values Options.Compression takes.
var Compressions = compression.Names

// ParseCompression maps Options.Compression to badger's setting; empty
// means none.
func ParseCompression(name string) (options.CompressionType, error) {
	return compression.Choose(name, options.None, options.Snappy, options.ZSTD)
}
