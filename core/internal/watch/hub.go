// Package watch owns etcd watch semantics: delivering every committed event
// in a key range from a start revision onward, in revision order, with no gap
// and no duplicate, framed into responses as etcd frames them, plus progress
// notifications and cancellation on compaction.
//
// Design. The MVCC writer hands each committed group of events to the Hub
// (Notify) before acknowledging the writes. The Hub keeps the most recent
// events in memory (the tail) and wakes watchers; it never blocks on a
// watcher. Each watcher runs its own loop that pulls events from a cursor:
// from the tail when the cursor is inside it, otherwise from the durable change
// log (Source.Events). So a slow watcher only falls back to reading storage;
// it never holds memory hostage or stalls the writer, and a watch from any
// uncompacted revision works after a restart, when the tail is empty
// (DESIGN.md, "Watch").
//
// Invariants:
//   - The tail holds every event with revision in [tailStart, head]: once
//     trimmed, the newest whole revisions within TailEvents events and
//     TailBytes bytes (keys and values, previous values included), and it
//     grows to at most about twice either bound before the next trim.
//   - A watcher's cursor only moves forward; everything below it that matches
//     the watcher was handed to its sink, in revision order.
//   - A progress notification with revision R is sent only when every event
//     up to R was handed to the sink.
//
// It must not know about gRPC streams or storage layout; the API layer turns
// Responses into etcd WatchResponses. From package coder it takes only
// InRange, etcd's rule for which keys a range holds, so that a watch and a
// read of the same range can never disagree on its edge.
package watch

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/engramkv/engram/core/internal/clock"
	"github.com/engramkv/engram/core/internal/coder"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Source is the durable history a Hub serves old revisions from.
type Source interface {
	// Rev returns the current revision.
	Rev() int64
	// CompactRev returns the compacted revision.
	CompactRev() int64
	// Events returns the events in [from, to] in revision order, whole
	// revisions at a time, stopping once max events are collected; next is
	// the first revision not returned.
	Events(ctx context.Context, from, to int64, max int) (events []*mvccpb.Event, next int64, err error)
}

// Options configure a Hub.
type Options struct {
	// TailEvents is how many recent events stay in memory.
	TailEvents int
	// TailBytes bounds the keys and values (previous values included) the
	// tail keeps: kube-apiserver's objects are a few KiB each, and 16,384
	// events of them held most of a small cluster's heap (DESIGN.md,
	// "Watch"). 0 means 8 MiB.
	TailBytes int64
	// BatchEvents bounds the events in one response to a watcher.
	BatchEvents int
	// ProgressInterval is the period of progress notifications for watchers
	// that asked for them; 0 disables them.
	ProgressInterval time.Duration
	// Clock times progress notifications and the back-off after a failed
	// history read; nil means the system clock.
	Clock clock.Clock
	// MaxLag cancels a watcher that falls more than this many revisions
	// behind the head; 0 disables the limit.
	MaxLag int64
	// IsCompacted recognises Source's "compacted" error.
	IsCompacted func(error) bool
	Logger      *slog.Logger
	Metrics     *Metrics
}

// Hub fans committed events out to watchers.
type Hub struct {
	src  Source
	opts Options
	log  *slog.Logger

	mu        sync.RWMutex
	tail      []*mvccpb.Event
	tailBytes int64 // eventBytes of the tail's events
	tailStart int64 // lowest revision fully held in tail
	head      int64
	changed   chan struct{} // closed and replaced on every Notify
	closed    bool

	// base is cancelled by Close; every watcher's context derives from it,
	// so Close also ends watchers blocked in a sink.
	base       context.Context
	cancelBase context.CancelFunc
	wg         sync.WaitGroup
}

// NewHub returns a Hub whose head is the source's current revision.
func NewHub(src Source, opts Options) *Hub {
	if opts.TailEvents <= 0 {
		opts.TailEvents = 16 << 10
	}
	if opts.TailBytes <= 0 {
		opts.TailBytes = 8 << 20
	}
	if opts.BatchEvents <= 0 {
		opts.BatchEvents = 1000
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.IsCompacted == nil {
		opts.IsCompacted = func(error) bool { return false }
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real
	}
	head := src.Rev()
	base, cancel := context.WithCancel(context.Background())
	return &Hub{src: src, opts: opts, log: opts.Logger, head: head, tailStart: head + 1, changed: make(chan struct{}), base: base, cancelBase: cancel}
}

// Notify appends committed events (revision order, all above the current
// head) and wakes the watchers. It never blocks on a watcher.
func (h *Hub) Notify(head int64, events []*mvccpb.Event) {
	h.mu.Lock()
	h.tail = append(h.tail, events...)
	for _, ev := range events {
		h.tailBytes += eventBytes(ev)
	}
	// Trim only once the tail holds twice a bound, back down to both
	// bounds: each trim copies the tail, so trimming on every Notify would
	// cost O(tail) per write; this way it is O(1) amortized.
	if len(h.tail) > 2*h.opts.TailEvents || h.tailBytes > 2*h.opts.TailBytes {
		cut := max(len(h.tail)-h.opts.TailEvents, 0)
		var dropped int64
		for _, ev := range h.tail[:cut] {
			dropped += eventBytes(ev)
		}
		for cut < len(h.tail) && h.tailBytes-dropped > h.opts.TailBytes {
			dropped += eventBytes(h.tail[cut])
			cut++
		}
		// Drop whole revisions from the front.
		for cut > 0 && cut < len(h.tail) && h.tail[cut].Kv.ModRevision == h.tail[cut-1].Kv.ModRevision {
			dropped += eventBytes(h.tail[cut])
			cut++
		}
		h.tailBytes -= dropped
		if cut < len(h.tail) {
			h.tailStart = h.tail[cut].Kv.ModRevision
		} else {
			h.tailStart = head + 1
		}
		// Copy so the dropped prefix can be collected.
		h.tail = append(make([]*mvccpb.Event, 0, h.opts.TailEvents+len(events)), h.tail[cut:]...)
	}
	h.head = head
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
	if m := h.opts.Metrics; m != nil {
		m.events.Add(float64(len(events)))
	}
}

// Head returns the revision of the last event the Hub has seen.
func (h *Hub) Head() int64 {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.head
}

// state returns the head and a channel closed on the next Notify.
func (h *Hub) state() (int64, <-chan struct{}) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.head, h.changed
}

// fromTail returns the tail's events with revision >= from, whole revisions,
// about max of them. ok is false when from is below the tail.
func (h *Hub) fromTail(from int64, max int) (events []*mvccpb.Event, next int64, ok bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if from < h.tailStart {
		return nil, from, false
	}
	i := sort.Search(len(h.tail), func(i int) bool { return h.tail[i].Kv.ModRevision >= from })
	j := min(i+max, len(h.tail))
	for j < len(h.tail) && j > i && h.tail[j].Kv.ModRevision == h.tail[j-1].Kv.ModRevision {
		j++
	}
	if j == len(h.tail) {
		next = h.head + 1
	} else {
		next = h.tail[j].Kv.ModRevision
	}
	return h.tail[i:j:j], next, true
}

// Close stops every watcher loop and waits for them.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closed = true
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
	h.cancelBase()
	h.wg.Wait()
}

// Response is one message to a watcher's client.
type Response struct {
	WatchID int64
	Events  []*mvccpb.Event
	// Revision is the header revision: for events, the head when they were
	// read; for progress, the revision up to which everything was sent.
	Revision int64
	// Progress marks a progress notification (no events).
	Progress bool
	// Canceled ends the watch; CompactRevision is set when the cause is
	// compaction, Reason otherwise.
	Canceled        bool
	CompactRevision int64
	Reason          string
}

// Sink receives a watcher's responses in order. It may block (stream flow
// control) but must return when ctx, the watcher's context, is done; an error
// ends the watcher.
type Sink func(ctx context.Context, r Response) error

// Request describes a watch.
type Request struct {
	ID       int64
	Key, End []byte
	// StartRevision is the first revision to deliver; 0 means head+1.
	StartRevision  int64
	PrevKV         bool
	NoPut          bool
	NoDelete       bool
	ProgressNotify bool
}

// Watcher is a running watch.
type Watcher struct {
	hub    *Hub
	req    Request
	sink   Sink
	cancel context.CancelFunc
	done   chan struct{}
	// onAdvance is called after the watcher's delivered revision moves.
	onAdvance func()

	// synced is set once the watcher has caught up with the head it
	// started below (or from the start when it started above it); only
	// the watcher's own loop touches it.
	synced bool

	mu        sync.Mutex
	delivered int64 // every matching event <= delivered was sent
}

// ErrClosed is returned by Watch after Close.
var ErrClosed = errors.New("watch: hub closed")

// Watch starts a watcher. Its loop runs until Stop, ctx ends, the sink
// fails, or it is cancelled (compaction, lag); onAdvance, if non-nil, is
// called whenever its delivered revision moves.
func (h *Hub) Watch(ctx context.Context, req Request, sink Sink, onAdvance func()) (*Watcher, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrClosed
	}
	if req.StartRevision <= 0 {
		req.StartRevision = h.head + 1
	}
	// As in etcd, a watcher starting above the head is synced from the
	// start; one starting at or below it catches up first (see send).
	synced := req.StartRevision > h.head
	h.wg.Add(1)
	h.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	stopWithHub := context.AfterFunc(h.base, cancel)
	w := &Watcher{hub: h, req: req, sink: sink, cancel: cancel, done: make(chan struct{}), onAdvance: onAdvance, delivered: req.StartRevision - 1, synced: synced}
	if m := h.opts.Metrics; m != nil {
		m.watchers.Inc()
	}
	go func() {
		defer stopWithHub()
		w.run(ctx)
	}()
	return w, nil
}

// ID returns the watch ID.
func (w *Watcher) ID() int64 { return w.req.ID }

// Stop ends the watcher and waits for its loop to exit.
func (w *Watcher) Stop() {
	w.cancel()
	<-w.done
}

// Done is closed when the watcher's loop has exited.
func (w *Watcher) Done() <-chan struct{} { return w.done }

// Delivered returns the revision up to which every matching event was sent.
func (w *Watcher) Delivered() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.delivered
}

func (w *Watcher) setDelivered(rev int64) {
	w.mu.Lock()
	moved := rev > w.delivered
	if moved {
		w.delivered = rev
	}
	w.mu.Unlock()
	if moved && w.onAdvance != nil {
		w.onAdvance()
	}
}

func (w *Watcher) run(ctx context.Context) {
	h := w.hub
	defer func() {
		close(w.done)
		h.wg.Done()
		if m := h.opts.Metrics; m != nil {
			m.watchers.Dec()
		}
	}()
	cursor := w.req.StartRevision
	var progress <-chan time.Time
	if w.req.ProgressNotify && h.opts.ProgressInterval > 0 {
		t := h.opts.Clock.NewTicker(h.opts.ProgressInterval)
		defer t.Stop()
		progress = t.C()
	}
	sentSinceTick := false
	retry := time.Duration(0)
	for {
		if ctx.Err() != nil {
			return
		}
		head, changed := h.state()
		if h.isClosed() {
			return
		}
		if compact := h.src.CompactRev(); cursor < compact {
			_ = w.sink(ctx, Response{WatchID: w.req.ID, Canceled: true, CompactRevision: compact, Revision: head})
			return
		}
		if lag := head - cursor; h.opts.MaxLag > 0 && lag > h.opts.MaxLag {
			if m := h.opts.Metrics; m != nil {
				m.lagCancels.Inc()
			}
			_ = w.sink(ctx, Response{WatchID: w.req.ID, Canceled: true, Revision: head,
				Reason: "engram: watcher fell too far behind (more than the configured watch.max-lag revisions); re-watch from the last received revision"})
			return
		}
		if cursor <= head {
			events, next, ok := h.fromTail(cursor, h.opts.BatchEvents)
			if !ok {
				var err error
				events, next, err = h.src.Events(ctx, cursor, head, h.opts.BatchEvents)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					if h.opts.IsCompacted(err) {
						continue // the compaction check above cancels it
					}
					retry = min(max(2*retry, 10*time.Millisecond), time.Second)
					h.log.Warn("watch: reading history failed; retrying", "watch", w.req.ID, "from", cursor, "err", err)
					backoff := h.opts.Clock.NewTimer(retry)
					select {
					case <-backoff.C():
					case <-ctx.Done():
						backoff.Stop()
						return
					}
					continue
				}
				retry = 0
				if m := h.opts.Metrics; m != nil {
					m.historyReads.Inc()
				}
			}
			if out := w.filter(events, h.src.CompactRev()); len(out) > 0 {
				if !w.send(ctx, out, max(head, next-1)) {
					return
				}
				sentSinceTick = true
			}
			cursor = next
			if cursor > head {
				w.synced = true
			}
			w.setDelivered(cursor - 1)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-progress:
			if !sentSinceTick {
				// Synced: cursor == head+1, so everything <= head was sent.
				if err := w.sink(ctx, Response{WatchID: w.req.ID, Progress: true, Revision: head}); err != nil {
					return
				}
			}
			sentSinceTick = false
		}
	}
}

// send frames events as etcd does. A synced watcher gets one response per
// revision, headed by that revision, as etcd's synced watchers do, even
// when several revisions piled up while its client was slow; a watcher
// still catching up to the head it started below gets each batch in one
// response headed by the store's revision, as etcd's unsynced watchers do.
// Clients that take a response's header as "everything up to here" see the
// same boundaries on both servers. It reports whether the sink took
// everything.
func (w *Watcher) send(ctx context.Context, events []*mvccpb.Event, head int64) bool {
	if !w.synced {
		return w.sink(ctx, Response{WatchID: w.req.ID, Events: events, Revision: head}) == nil
	}
	for len(events) > 0 {
		rev := events[0].Kv.ModRevision
		n := 1
		for n < len(events) && events[n].Kv.ModRevision == rev {
			n++
		}
		if w.sink(ctx, Response{WatchID: w.req.ID, Events: events[:n:n], Revision: rev}) != nil {
			return false
		}
		events = events[n:]
	}
	return true
}

func (h *Hub) isClosed() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.closed
}

// filter selects the events of the watcher's range and types, without
// prev_kv unless asked. As in etcd, an event at or below the compacted
// revision gets no prev_kv: its previous version is compacted. Events are
// shared between watchers, so it copies rather than modifies them.
func (w *Watcher) filter(events []*mvccpb.Event, compacted int64) []*mvccpb.Event {
	var out []*mvccpb.Event
	for _, ev := range events {
		if !coder.InRange(ev.Kv.Key, w.req.Key, w.req.End) {
			continue
		}
		if ev.Type == mvccpb.PUT && w.req.NoPut || ev.Type == mvccpb.DELETE && w.req.NoDelete {
			continue
		}
		if ev.PrevKv != nil && (!w.req.PrevKV || ev.Kv.ModRevision <= compacted) {
			ev = &mvccpb.Event{Type: ev.Type, Kv: ev.Kv}
		}
		out = append(out, ev)
	}
	return out
}

// eventOverhead approximates what an event costs beyond its keys and values
// (the event, its key-values, slice headers).
const eventOverhead = 160

// eventBytes is what an event in the tail holds.
func eventBytes(ev *mvccpb.Event) int64 {
	n := eventOverhead + len(ev.Kv.Key) + len(ev.Kv.Value)
	if ev.PrevKv != nil {
		n += len(ev.PrevKv.Key) + len(ev.PrevKv.Value)
	}
	return int64(n)
}
