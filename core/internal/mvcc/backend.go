// Package mvcc is Engram's multi-version store: etcd's data model (revisions,
// create/mod revisions, versions, leases, reads at any uncompacted revision,
// transactions, compaction) built on the small kv.Store contract.
//
// It owns the single serial writer that allocates revisions, evaluates every
// write against the latest state, and commits many writes in one atomic batch
// (group commit: one fsync for all of them). It must not speak gRPC or know
// about watchers beyond handing committed events to a Notifier.
//
// # Data layout (see package coder for the key format)
//
//	revision key(k)   -> k's latest version: header + value (a tombstone after a delete)
//	object key(k, r)  -> header + value of k's version at revision r, for every
//	                     version that a later one superseded (history)
//	event key(r)      -> the keys changed at revision r, with their previous revisions
//	lease key(id)     -> granted TTL
//	lease index(id,k) -> present while k is attached to lease id
//	meta "compact"    -> compacted and physically compacted revisions
//
// A write moves the key's current version from its revision key into history
// and puts the new one in the revision key, in one batch. So a read at the
// current revision (nearly every read) scans revision keys only and needs no
// second lookup for values, a point read is one Get, and no value is stored
// twice. A read at an older revision falls back to history for keys changed
// since. On the writing node, recently used revision-key records are also
// cached in memory (latest.go), so point reads and the writer's checks of
// compares and CASes usually need no engine lookup.
//
// # Invariants
//
//   - Revisions are dense: a write transaction that changes anything takes
//     exactly clock+1; one that changes nothing takes none.
//   - A write is acknowledged only after the batch holding it committed; the
//     clock is advanced (making the revision readable) before acknowledgement,
//     so every linearizable read that starts after an ack sees the write.
//   - Every write transaction updates the revision key of each key it touches
//     with a compare-and-swap against the value the writer read, and creates
//     the change-log record of its revision with put-if-absent, so a second
//     writer on the same store (a deposed leader) can never interleave
//     silently: its batch fails whole.
//   - The revision key, the object key, the change-log record and lease index
//     changes of a write are in one batch: a crash leaves all or none.
//   - Reads never go back in revision, on any node (linearizability): once
//     a read has observed revision N, every operation that starts later, on
//     this node or another, observes at least N and every write at or below
//     it. A leader publishes a revision only after the engine acknowledged
//     it, and in a cluster a leader read also waits for a commit in flight
//     (followers read the store, which may show that commit first) and is
//     refused once the leader's lease ran out; a follower read takes the
//     revision from a store read that started after the read did
//     (readbarrier.go). tests/linearizability checks recorded histories of
//     both with porcupine.
//   - For every key, the versions above the compacted revision and the
//     latest one at or below it stay readable (in history or the revision
//     key), so reads at any uncompacted revision and prev_kv of every event
//     above the compacted revision are answerable.
package mvcc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/internal/lease"
	"github.com/engramkv/engram/core/internal/tso"
	"github.com/engramkv/engram/core/kv"
)

// Errors with etcd semantics; the API layer maps them to etcd's status codes.
var (
	ErrCompacted     = errors.New("mvcc: required revision has been compacted")
	ErrFutureRev     = errors.New("mvcc: required revision is a future revision")
	ErrLeaseNotFound = errors.New("lease not found")
	ErrLeaseExists   = errors.New("lease already exists")
	ErrKeyNotFound   = errors.New("key not found")
	ErrClosed        = errors.New("mvcc: backend closed")
	// ErrStoreConflict means the store changed underneath the writer: another
	// writer committed to the same keys. The write was not applied.
	ErrStoreConflict = errors.New("mvcc: store modified by another writer")
	// ErrUnavailable wraps storage failures; the write was not applied.
	ErrUnavailable = errors.New("mvcc: storage unavailable")
	// ErrTooLarge means one write transaction touches more than the storage
	// engine can apply atomically. Nothing was written.
	ErrTooLarge = errors.New("mvcc: transaction too large for one atomic commit of the storage engine")
	// ErrNotLeader means this node may not write: it is a follower, or it
	// lost the leadership. The write was not applied.
	ErrNotLeader = errors.New("mvcc: not the leader")
)

const metaCompact = "compact"

// DefaultLatestCacheBytes is the latest-record cache's default budget.
const DefaultLatestCacheBytes = 64 << 20

// Notifier receives committed events in revision order, before the writes
// are acknowledged. head is the revision of the last event.
type Notifier interface {
	Notify(head int64, events []*mvccpb.Event)
}

// Options configure a Backend.
type Options struct {
	Store  kv.Store
	Lessor *lease.Lessor
	Logger *slog.Logger
	// MaxGroupRequests bounds how many write requests share one commit.
	MaxGroupRequests int
	// MaxGroupBytes bounds the approximate size of one commit.
	MaxGroupBytes int
	// Registerer receives the backend's metrics; nil records none.
	Registerer prometheus.Registerer
	// Fence, when set, is called before every commit: it returns an op
	// added to the batch that fails the batch if this node lost the
	// leadership (see package election), or an error to refuse to write.
	Fence func() (kv.Op, error)
	// ReadOnly opens a follower's view: no writer, no compaction, no
	// leases; every read takes the current and compacted revisions from the
	// store, so it sees every write acknowledged by the leader before it.
	ReadOnly bool
	// LatestCacheBytes bounds the writer's cache of latest records (see
	// latest.go); 0 means 64 MiB, a negative value disables it. A ReadOnly
	// backend has none.
	LatestCacheBytes int64
	// TempDir is where HashKV and snapshots spill sorted runs when the
	// history does not fit their memory budget; "" means os.TempDir().
	TempDir string
}

// Backend is the MVCC store. All methods are safe for concurrent use.
type Backend struct {
	store  kv.Store
	lessor *lease.Lessor
	log    *slog.Logger
	clock  *tso.Clock

	compactRev atomic.Int64
	compactMu  sync.Mutex // serialises Compact calls
	compactReq chan struct{}
	physical   atomic.Int64 // revision up to which history was removed

	notifier atomic.Pointer[notifierBox]
	pins     pinSet

	maxGroupRequests int
	maxGroupBytes    int
	metrics          *metrics
	fence            func() (kv.Op, error)
	readOnly         bool
	counts           *countCache
	latest           *latestCache // nil on followers or when disabled
	barrier          readBarrier
	tempDir          string
	inflight         atomic.Pointer[inflightCommit] // leaders over a shared store only

	reqs   chan *request
	stopCh chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool
}

type notifierBox struct{ n Notifier }

// Open recovers a Backend from store: the revision, the compacted revision,
// and the leases with their attached keys. It starts the writer.
func Open(ctx context.Context, opts Options) (*Backend, error) {
	if opts.Store == nil {
		return nil, errors.New("mvcc: no store")
	}
	if opts.Lessor == nil {
		opts.Lessor = lease.New(lease.Options{})
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxGroupRequests <= 0 {
		opts.MaxGroupRequests = 1024
	}
	if opts.MaxGroupBytes <= 0 {
		// Well inside badger's per-transaction limit (~9.6 MB by default).
		opts.MaxGroupBytes = 4 << 20
	}
	if err := checkImportRecord(ctx, opts.Store); err != nil {
		return nil, err
	}
	rev, err := tso.Recover(ctx, opts.Store)
	if err != nil {
		return nil, err
	}
	b := &Backend{
		store:            opts.Store,
		lessor:           opts.Lessor,
		log:              opts.Logger,
		clock:            tso.New(rev),
		compactReq:       make(chan struct{}, 1),
		maxGroupRequests: opts.MaxGroupRequests,
		maxGroupBytes:    opts.MaxGroupBytes,
		reqs:             make(chan *request, 4096),
		stopCh:           make(chan struct{}),
		fence:            opts.Fence,
		readOnly:         opts.ReadOnly,
		counts:           newCountCache(1 << 20),
		tempDir:          opts.TempDir,
	}
	if !opts.ReadOnly && opts.LatestCacheBytes >= 0 {
		size := opts.LatestCacheBytes
		if size == 0 {
			size = DefaultLatestCacheBytes
		}
		b.latest = newLatestCache(size)
	}
	b.pins.m = map[int64]int{}
	b.barrier.fetch = b.fetchRevisions
	b.metrics = newMetrics(opts.Registerer, b)
	if err := b.loadCompacted(ctx); err != nil {
		return nil, err
	}
	if opts.ReadOnly {
		return b, nil
	}
	if err := b.loadLeases(ctx); err != nil {
		return nil, err
	}
	b.wg.Add(2)
	go b.writeLoop()
	go b.compactLoop()
	if b.physical.Load() < b.compactRev.Load() {
		b.kickCompaction()
	}
	b.log.Info("mvcc backend recovered", "revision", rev, "compacted", b.compactRev.Load())
	return b, nil
}

// SetNotifier installs the receiver of committed events. Call it before the
// first write.
func (b *Backend) SetNotifier(n Notifier) { b.notifier.Store(&notifierBox{n}) }

// Rev returns the current revision.
func (b *Backend) Rev() int64 { return b.clock.Current() }

// CompactRev returns the compacted revision (0 if never compacted).
func (b *Backend) CompactRev() int64 { return b.compactRev.Load() }

// TempDir is where the backend's temporary files go ("" = os.TempDir()).
func (b *Backend) TempDir() string { return b.tempDir }

// Lessor returns the lessor the backend keeps in step with the store.
func (b *Backend) Lessor() *lease.Lessor { return b.lessor }

// Close stops the writer after the requests already queued are committed and
// acknowledged. It does not close the store.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	close(b.stopCh)
	if b.readOnly {
		return nil
	}
	b.wg.Wait()
	return nil
}

// readRevisions returns the revision a read observes and the compacted
// revision. A follower reads both from the store: the change log's last
// record is the highest revision any leader committed.
//
// On a leader over a shared store (a cluster: Fence is set) a read checks
// that the leader's lease still holds, and waits for a commit in flight: the engine may already show that commit's
// revision to the followers, which read the store, before this node
// publishes it, and no read may return an older revision than one another
// read already observed (linearizability). A single node's store has no
// other reader, so it needs no wait.
func (b *Backend) readRevisions(ctx context.Context) (int64, int64, error) {
	if b.readOnly {
		return b.barrier.wait(ctx)
	}
	if b.fence != nil {
		// A leader whose lease ran out may already have a successor
		// taking writes: it must not answer from its own clock. (The
		// elector steps down only at its next tick.)
		if _, err := b.fence(); err != nil {
			return 0, 0, fmt.Errorf("%w: %w", ErrNotLeader, err)
		}
		for {
			inf := b.inflight.Load()
			if inf == nil || inf.rev <= b.clock.Current() {
				break
			}
			select {
			case <-inf.done:
			case <-ctx.Done():
				return 0, 0, ctx.Err()
			}
		}
	}
	return b.clock.Current(), b.compactRev.Load(), nil
}

// inflightCommit is a commit the writer has sent to the engine and not yet
// published (or failed): rev is the revision it publishes, done closes
// once it is settled.
type inflightCommit struct {
	rev  int64
	done chan struct{}
}

// fetchRevisions reads the current and compacted revisions from the store.
func (b *Backend) fetchRevisions(ctx context.Context) (int64, int64, error) {
	rev, err := tso.Recover(ctx, b.store)
	if err != nil {
		return 0, 0, storageErr("read revision", err)
	}
	if err := b.loadCompacted(ctx); err != nil {
		return 0, 0, storageErr("read compacted revision", err)
	}
	b.clock.Advance(max(rev, b.clock.Current()))
	return b.clock.Current(), b.compactRev.Load(), nil
}

func (b *Backend) loadCompacted(ctx context.Context) error {
	v, err := b.store.Get(ctx, coder.MetaKey(metaCompact))
	if errors.Is(err, kv.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mvcc: read compacted revision: %w", err)
	}
	if len(v) != 16 {
		return fmt.Errorf("mvcc: compacted revision record of %d bytes", len(v))
	}
	storeMax(&b.compactRev, int64(binary.BigEndian.Uint64(v)))
	storeMax(&b.physical, int64(binary.BigEndian.Uint64(v[8:])))
	return nil
}

func (b *Backend) loadLeases(ctx context.Context) error {
	leases, err := b.storedLeases(ctx)
	if err != nil {
		return fmt.Errorf("mvcc: load leases: %w", err)
	}
	for _, l := range leases {
		b.lessor.Grant(l.ID, l.TTL)
	}
	err = scanAll(ctx, b.store, kv.ScanOptions{Start: coder.Prefix(coder.SpaceLeaseKeys), End: coder.SpaceEnd(coder.SpaceLeaseKeys)}, func(p kv.Pair) error {
		id, key, err := coder.DecodeLeaseIndexKey(p.Key)
		if err != nil {
			return err
		}
		b.lessor.Attach(id, key)
		return nil
	})
	if err != nil {
		return fmt.Errorf("mvcc: load lease attachments: %w", err)
	}
	return nil
}

// storeMax raises a to v; revisions only move forward.
func storeMax(a *atomic.Int64, v int64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// scanAll calls fn for every pair of a scan.
func scanAll(ctx context.Context, s kv.Store, opts kv.ScanOptions, fn func(kv.Pair) error) error {
	it, err := s.Scan(ctx, opts)
	if err != nil {
		return err
	}
	defer it.Close()
	for {
		batch, err := it.Next(ctx)
		if err != nil {
			return err
		}
		if len(batch) == 0 {
			return nil
		}
		for _, p := range batch {
			if err := fn(p); err != nil {
				return err
			}
		}
	}
}

// pinSet records the revisions that in-flight reads depend on, so physical
// compaction never removes history a running read still needs.
type pinSet struct {
	mu sync.Mutex
	m  map[int64]int
}

// pin registers a read at rev. It fails with ErrCompacted if rev is below the
// compacted revision; the check happens after registering so a concurrent
// compaction either sees the pin or the read sees the new compacted revision.
func (b *Backend) pin(rev int64) (func(), error) {
	b.pins.mu.Lock()
	b.pins.m[rev]++
	b.pins.mu.Unlock()
	unpin := func() {
		b.pins.mu.Lock()
		if b.pins.m[rev]--; b.pins.m[rev] == 0 {
			delete(b.pins.m, rev)
		}
		b.pins.mu.Unlock()
	}
	if rev < b.compactRev.Load() {
		unpin()
		return nil, ErrCompacted
	}
	return unpin, nil
}

// pinnedBelow reports whether any read is pinned below rev.
func (b *Backend) pinnedBelow(rev int64) bool {
	b.pins.mu.Lock()
	defer b.pins.mu.Unlock()
	for r := range b.pins.m {
		if r < rev {
			return true
		}
	}
	return false
}
