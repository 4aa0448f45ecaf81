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
	// lost the leadership. The write was not applied: the API layer relies
	// on that to run the request again under the node's next role, so an
	// error whose outcome is unknown must never wrap it.
	ErrNotLeader = errors.New("mvcc: not the leader")
)

func storageErr(op string, err error) error {
	if errors.Is(err, kv.ErrClosed) {
		return ErrClosed
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}

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
	// PipelineDepth bounds the groups committing or waiting to commit
	// (pipeline.go); 0 means 4.
	PipelineDepth int
	// ReadCreates makes a create read its key ahead like any other write
	// instead of presuming it absent (presume.go): for measuring the
	// difference, and for tests of the read path.
	ReadCreates bool
}

// Backend is the MVCC store. All methods are safe for concurrent use.
type Backend struct {
	store  kv.Store
	lessor *lease.Lessor
	log    *slog.Logger
	clock  *tso.Clock

	compactRev atomic.Int64
	// compacted is set once a compaction mark is stored: etcd tells a
	// store never compacted (where Compact(0) succeeds) from one
	// compacted at 0. An old data directory without a mark reads as never
	// compacted.
	compacted  atomic.Bool
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
	// unresolved is the revision of a commit whose outcome this leader
	// never learned (its read-back was abandoned: the backend closed, or
	// the engine did). The engine may show it to the followers while the
	// clock stays below it, so from then on no read answers from the clock
	// (readRevisions). Set before the commit's in-flight marker is cleared.
	unresolved atomic.Int64
	// readWaits, when set (tests), is told when a read starts waiting for
	// a commit in flight.
	readWaits chan<- struct{}

	pipelineDepth int
	presume       presumption
	// committedSeq is the sequence number of the last group the committer
	// finished with (committed, or failed for good): prefetch.go's S.
	committedSeq atomic.Uint64
	// writerBusy is the writer's busy time in nanoseconds (metrics.go).
	writerBusy atomic.Int64

	w      *writer // nil on followers; its state is the writer goroutine's own
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
		pipelineDepth:    opts.PipelineDepth,
		presume:          presumption{off: opts.ReadCreates},
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
	w := newWriter(b)
	b.w = w
	b.wg.Add(3)
	go w.writeLoop()
	go b.commitLoop(w.p)
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

// CompactRev returns the compacted revision (0 if never compacted; see
// compactFloor for the difference etcd makes).
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
	b.metrics.unregister()
	return nil
}

// readRevisions returns the revision a read observes and the compacted
// revision. A follower reads both from the store: the change log's last
// record is the highest revision any leader committed.
//
// On a leader over a shared store (a cluster: Fence is set) a read checks
// that the leader's lease still holds, and waits for a commit in flight:
// the engine may already show that commit's revision to the followers,
// which read the store, before this node publishes it, and no read may
// return an older revision than one another read already observed
// (linearizability). A single node's store has no other reader, so it
// needs no wait. (DESIGN.md, "The read barrier").
func (b *Backend) readRevisions(ctx context.Context) (int64, int64, error) {
	if b.readOnly {
		return b.barrier.wait(ctx)
	}
	if b.fence != nil {
		// A leader whose lease ran out may already have a successor
		// taking writes: it must not answer from its own clock. (The
		// elector steps down only at its next tick.)
		// The lease is checked again after every wait: a wait can outlast
		// it.
		for {
			if _, err := b.fence(); err != nil {
				return 0, 0, fmt.Errorf("%w: %w", ErrNotLeader, err)
			}
			inf := b.inflight.Load()
			if inf == nil || inf.rev <= b.clock.Current() {
				break
			}
			if b.readWaits != nil {
				b.readWaits <- struct{}{}
			}
			select {
			case <-inf.done:
			case <-ctx.Done():
				return 0, 0, ctx.Err()
			}
		}
		// After the marker: a commit that settled unresolved set this
		// before it cleared the marker.
		if rev := b.unresolved.Load(); rev > b.clock.Current() {
			return 0, 0, fmt.Errorf("%w: the outcome of the commit of revision %d is unknown to this node", ErrNotLeader, rev)
		}
	}
	return b.clock.Current(), b.compactRev.Load(), nil
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
	b.compacted.Store(true)
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
