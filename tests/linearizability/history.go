package linearizability

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// Pending is the return time of an operation whose outcome is unknown: it
// may take effect at any point after its call (porcupine's convention for
// an operation that never returned).
const Pending int64 = math.MaxInt64

// Op is one recorded operation. Times are nanoseconds since the history
// began, from the test process's monotonic clock, which every client and
// the watcher share.
type Op struct {
	// Client is the recording client's index; read-backs use their own.
	Client int
	Call   int64
	Return int64 // Pending when the outcome is unknown
	Req    Request
	Resp   Response
	// Readback marks a Range made after a restart or failover to check
	// that every acknowledged write survived.
	Readback bool
	// Note says where the operation went (an endpoint, a fault phase), for
	// reports.
	Note string
}

func (o Op) String() string {
	ret := "pending"
	if o.Return != Pending {
		ret = fmt.Sprintf("%.4fs", seconds(o.Return))
	}
	s := fmt.Sprintf("client %d [%.4fs, %s] %s -> %s", o.Client, seconds(o.Call), ret, o.Req, o.Resp.Format(o.Req.Kind))
	if o.Readback {
		s += " (read-back)"
	}
	if o.Note != "" {
		s += " {" + o.Note + "}"
	}
	return s
}

// Acknowledged reports whether o is a write the client saw succeed and that
// changed the store, and at which revision.
func (o Op) Acknowledged() (int64, bool) {
	if o.Resp.Unknown || o.Return == Pending {
		return 0, false
	}
	switch o.Req.Kind {
	case Put:
		return o.Resp.Rev, true
	case CAS:
		return o.Resp.Rev, o.Resp.Succeeded
	case Delete:
		return o.Resp.Rev, o.Resp.Deleted == 1
	}
	return 0, false
}

func seconds(ns int64) float64 { return float64(ns) / 1e9 }

// EventType is a watch event's type.
type EventType uint8

const (
	// EventPut is a key written.
	EventPut EventType = iota + 1
	// EventDelete is a key deleted.
	EventDelete
)

func (t EventType) String() string {
	if t == EventDelete {
		return "DELETE"
	}
	return "PUT"
}

// WatchEvent is one event the watcher received.
type WatchEvent struct {
	Recv int64 // when the watcher received it
	Type EventType
	Key  int
	// KV is the key after the event (for a delete, only Mod is set: the
	// deletion's revision).
	KV KeyValue
}

// Rev is the event's revision.
func (e WatchEvent) Rev() int64 { return e.KV.Mod }

func (e WatchEvent) String() string {
	return fmt.Sprintf("[%.4fs] rev %d %s k%d %s", seconds(e.Recv), e.Rev(), e.Type, e.Key, e.KV)
}

// WatchStart is one (re)start of the watcher: the revision it asked for.
type WatchStart struct {
	At      int64
	FromRev int64
	// After is how many events the watcher had received before.
	After int
}

// History is everything a run recorded.
type History struct {
	Ops         []Op
	Watch       []WatchEvent
	WatchStarts []WatchStart
	// WatchComplete: the watcher stopped because it had caught up with
	// the final revision, not because of an error or a deadline. Only then
	// does an unknown write missing from the watch count as not applied.
	WatchComplete bool
	// FinalRev is the revision of the last read-back, which the watcher
	// had to reach.
	FinalRev int64
}

// Recorder collects a history from concurrent clients. It is safe for
// concurrent use.
type Recorder struct {
	start time.Time

	mu          sync.Mutex
	ops         []Op
	watch       []WatchEvent
	watchStarts []WatchStart
	// acked counts the acknowledged writes.
	acked *progress
}

// NewRecorder starts a history now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now(), acked: newProgress(0)} }

// Now is the time since the history began, in nanoseconds (monotonic).
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// Add records a completed or pending operation.
func (r *Recorder) Add(op Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, op)
	if _, ok := op.Acknowledged(); ok {
		r.acked.add(1)
	}
}

// Acknowledged returns how many writes that changed the store were
// acknowledged so far.
func (r *Recorder) Acknowledged() int { return int(r.acked.get()) }

// AwaitAcknowledged waits until at least n writes that changed the store
// were acknowledged, or ctx ends. A test that injects a fault (a failover,
// a leader move) waits for it before and after, so that the history holds
// writes on both sides of the fault whatever the machine's speed; a
// history without them would pass the check and prove nothing.
func (r *Recorder) AwaitAcknowledged(ctx context.Context, n int) error {
	if got, ok := r.acked.await(ctx, int64(n)); !ok {
		return fmt.Errorf("%d of %d acknowledged writes: %w", got, n, ctx.Err())
	}
	return nil
}

// AddEvents records watch events received together.
func (r *Recorder) AddEvents(evs ...WatchEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watch = append(r.watch, evs...)
}

// WatchStarted records a watcher (re)start from rev.
func (r *Recorder) WatchStarted(rev int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watchStarts = append(r.watchStarts, WatchStart{At: r.Now(), FromRev: rev, After: len(r.watch)})
}

// Counts returns how many operations and watch events were recorded.
func (r *Recorder) Counts() (ops, events int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ops), len(r.watch)
}

// History returns a copy of what was recorded.
func (r *Recorder) History() History {
	r.mu.Lock()
	defer r.mu.Unlock()
	return History{
		Ops:         append([]Op(nil), r.ops...),
		Watch:       append([]WatchEvent(nil), r.watch...),
		WatchStarts: append([]WatchStart(nil), r.watchStarts...),
	}
}
