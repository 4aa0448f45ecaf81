package watch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/engramkv/engram/core/internal/clock/fakeclock"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// fakeSource keeps every event and serves history from it.
type fakeSource struct {
	mu      sync.Mutex
	events  []*mvccpb.Event
	rev     int64
	compact int64
	reads   int
}

var errCompacted = errors.New("compacted")

func (f *fakeSource) Rev() int64 { f.mu.Lock(); defer f.mu.Unlock(); return f.rev }
func (f *fakeSource) CompactRev() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.compact
}

func (f *fakeSource) Events(ctx context.Context, from, to int64, limit int) ([]*mvccpb.Event, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if from < f.compact {
		return nil, from, errCompacted
	}
	var out []*mvccpb.Event
	next := from
	// One event per revision from revision 2: start at from's index, so a
	// read costs what it returns, not the whole history.
	first := max(0, min(int(from)-2, len(f.events)))
	for _, ev := range f.events[first:] {
		r := ev.Kv.ModRevision
		if r < from || r > to {
			continue
		}
		if len(out) >= limit && r != next-1 {
			return out, next, nil
		}
		out = append(out, ev)
		next = r + 1
	}
	return out, to + 1, nil
}

// write commits one event per revision and notifies the hub.
func (f *fakeSource) write(h *Hub, key string) int64 {
	f.mu.Lock()
	f.rev++
	ev := &mvccpb.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: f.rev, CreateRevision: f.rev, Version: 1}}
	f.events = append(f.events, ev)
	rev := f.rev
	f.mu.Unlock()
	h.Notify(rev, []*mvccpb.Event{ev})
	return rev
}

func newHub(t *testing.T, src *fakeSource, opts Options) *Hub {
	opts.IsCompacted = func(err error) bool { return errors.Is(err, errCompacted) }
	h := NewHub(src, opts)
	t.Cleanup(h.Close)
	return h
}

type collector struct {
	mu    sync.Mutex
	resps []Response
	// changed is closed and replaced when a response arrives.
	changed chan struct{}
	block   chan struct{} // when non-nil, Send waits on it
	// entered, when non-nil, is signalled each time Send starts.
	entered chan struct{}
}

func (c *collector) sink(ctx context.Context, r Response) error {
	if c.entered != nil {
		select {
		case c.entered <- struct{}{}:
		default:
		}
	}
	if c.block != nil {
		select {
		case <-c.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resps = append(c.resps, r)
	if c.changed != nil {
		close(c.changed)
	}
	c.changed = make(chan struct{})
	return nil
}

// waitUntil waits until cond holds for the responses received so far.
func (c *collector) waitUntil(t *testing.T, what string, cond func(resps []Response) bool) {
	t.Helper()
	hang := time.After(hangGuard)
	for {
		c.mu.Lock()
		ok := cond(c.resps)
		if c.changed == nil {
			c.changed = make(chan struct{})
		}
		changed := c.changed
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-hang:
			t.Fatalf("waiting for %s: no progress in %v", what, hangGuard)
		}
	}
}

// hangGuard only turns a hung test into a failure; no test measures time.
const hangGuard = 30 * time.Second

// events counts the events in resps.
func events(resps []Response) int {
	n := 0
	for _, r := range resps {
		n += len(r.Events)
	}
	return n
}

func (c *collector) revs() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int64
	for _, r := range c.resps {
		for _, ev := range r.Events {
			out = append(out, ev.Kv.ModRevision)
		}
	}
	return out
}

// TestTailAndHistoryGiveEveryEventOnce writes more events than the tail
// holds and starts watchers at revisions inside and below the tail.
func TestTailAndHistoryGiveEveryEventOnce(t *testing.T) {
	src := &fakeSource{rev: 1}
	h := newHub(t, src, Options{TailEvents: 10, BatchEvents: 7})
	for i := range 50 {
		src.write(h, fmt.Sprintf("k%d", i%3))
	}
	for _, start := range []int64{2, 30, 45, 51, 60} {
		c := &collector{}
		w, err := h.Watch(context.Background(), Request{Key: []byte("k"), End: []byte("l"), StartRevision: start}, c.sink, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			src.write(h, fmt.Sprintf("k%d", i))
		}
		want := int(max(0, 61-max(start, 2)+1))
		c.waitUntil(t, fmt.Sprintf("%d events from %d", want, start), func(resps []Response) bool { return events(resps) >= want })
		revs := c.revs()
		for i, r := range revs {
			if r != max(start, 2)+int64(i) {
				t.Fatalf("start %d: event %d has revision %d: %v", start, i, r, revs)
			}
		}
		w.Stop()
		// Rewind the source for the next start: same history, new writes.
		src.mu.Lock()
		src.events = src.events[:len(src.events)-10]
		src.rev -= 10
		src.mu.Unlock()
		h = newHub(t, src, Options{TailEvents: 10, BatchEvents: 7})
	}
}

// TestSlowWatcherDoesNotBlockWriters blocks one watcher's sink entirely: the
// writer and another watcher must keep going, and the slow one must catch up
// from history once unblocked.
func TestSlowWatcherDoesNotBlockWriters(t *testing.T) {
	src := &fakeSource{rev: 1}
	h := newHub(t, src, Options{TailEvents: 16})
	slow := &collector{block: make(chan struct{})}
	fast := &collector{}
	if _, err := h.Watch(context.Background(), Request{Key: []byte{0}, End: []byte{0}}, slow.sink, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Watch(context.Background(), Request{Key: []byte{0}, End: []byte{0}}, fast.sink, nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		for i := range 1000 {
			src.write(h, fmt.Sprintf("k%d", i))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Fatal("writer blocked by a slow watcher")
	}
	fast.waitUntil(t, "fast watcher", func(resps []Response) bool { return events(resps) == 1000 })
	close(slow.block)
	slow.waitUntil(t, "slow watcher catching up", func(resps []Response) bool { return events(resps) == 1000 })
	for i, r := range slow.revs() {
		if r != int64(i+2) {
			t.Fatalf("slow watcher event %d at revision %d", i, r)
		}
	}
}

func TestLaggingWatcherIsCancelledWithReason(t *testing.T) {
	src := &fakeSource{rev: 1}
	h := newHub(t, src, Options{MaxLag: 100})
	c := &collector{block: make(chan struct{}), entered: make(chan struct{}, 1)}
	w, err := h.Watch(context.Background(), Request{Key: []byte("a")}, c.sink, nil)
	if err != nil {
		t.Fatal(err)
	}
	src.write(h, "a")
	<-c.entered // the watcher is blocked delivering it
	for range 200 {
		src.write(h, "b")
	}
	close(c.block)
	<-w.Done()
	c.mu.Lock()
	defer c.mu.Unlock()
	last := c.resps[len(c.resps)-1]
	if !last.Canceled || last.Reason == "" || last.CompactRevision != 0 {
		t.Fatalf("lagging watcher ended with %+v", last)
	}
}

func TestCompactionCancelsWatcherBelowIt(t *testing.T) {
	src := &fakeSource{rev: 1}
	h := newHub(t, src, Options{})
	for range 5 {
		src.write(h, "a")
	}
	src.mu.Lock()
	src.compact = 4
	src.mu.Unlock()
	c := &collector{}
	w, err := h.Watch(context.Background(), Request{Key: []byte("a"), StartRevision: 3}, c.sink, nil)
	if err != nil {
		t.Fatal(err)
	}
	<-w.Done()
	if len(c.resps) != 1 || !c.resps[0].Canceled || c.resps[0].CompactRevision != 4 {
		t.Fatalf("responses %+v", c.resps)
	}
}

// TestProgressNotifyOnlyWhenSynced drives progress ticks on a fake clock: a
// tick sends progress at the revision everything was delivered up to, but
// not when the watcher sent events since the tick before.
func TestProgressNotifyOnlyWhenSynced(t *testing.T) {
	t0 := time.Unix(0, 0)
	clk := fakeclock.New(t, t0)
	src := &fakeSource{rev: 1}
	h := newHub(t, src, Options{ProgressInterval: time.Second, Clock: clk})
	src.write(h, "x")
	c := &collector{}
	var advanced sync.WaitGroup
	advanced.Add(1)
	var once sync.Once
	w, err := h.Watch(context.Background(), Request{Key: []byte("a"), StartRevision: 1, ProgressNotify: true}, c.sink, func() { once.Do(advanced.Done) })
	if err != nil {
		t.Fatal(err)
	}
	advanced.Wait()
	if w.Delivered() != 2 {
		t.Fatalf("delivered %d", w.Delivered())
	}
	clk.WaitArmed(t0.Add(time.Second))
	clk.Advance(time.Second)
	c.waitUntil(t, "progress", func(resps []Response) bool { return len(resps) == 1 })

	src.write(h, "a")
	c.waitUntil(t, "the event", func(resps []Response) bool { return len(resps) == 2 })
	// Advance returns once the watcher took the tick, and the watcher takes
	// the second only after it handled the first.
	clk.Advance(time.Second)
	clk.Advance(time.Second)
	c.waitUntil(t, "progress", func(resps []Response) bool { return len(resps) == 3 })
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, want := range []Response{{Progress: true, Revision: 2}, {Revision: 3}, {Progress: true, Revision: 3}} {
		r := c.resps[i]
		if r.Progress != want.Progress || r.Revision != want.Revision || r.Progress == (len(r.Events) > 0) {
			t.Fatalf("response %d: %+v, want progress %v at %d", i, r, want.Progress, want.Revision)
		}
	}
}

func BenchmarkFanOut100Watchers(b *testing.B) {
	src := &fakeSource{rev: 1}
	h := NewHub(src, Options{})
	defer h.Close()
	var received atomic.Int64
	all := make(chan struct{})
	for i := range 100 {
		_, err := h.Watch(context.Background(), Request{Key: []byte(fmt.Sprintf("/r/%02d/", i)), End: []byte(fmt.Sprintf("/r/%02d0", i))}, func(ctx context.Context, r Response) error {
			if n := int64(len(r.Events)); n > 0 && received.Add(n) == int64(b.N) {
				close(all)
			}
			return nil
		}, nil)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		src.write(h, fmt.Sprintf("/r/%02d/obj", i%100))
	}
	<-all
}

// TestCloseEndsBlockedWatchers: a watcher whose client stopped reading must
// not keep Close (and so server shutdown) waiting.
func TestCloseEndsBlockedWatchers(t *testing.T) {
	src := &fakeSource{rev: 1}
	h := NewHub(src, Options{IsCompacted: func(error) bool { return false }})
	c := &collector{block: make(chan struct{})}
	w, err := h.Watch(context.Background(), Request{Key: []byte("a")}, c.sink, nil)
	if err != nil {
		t.Fatal(err)
	}
	src.write(h, "a")
	closed := make(chan struct{})
	go func() {
		h.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(hangGuard):
		t.Fatal("Close waited for a watcher blocked in its sink")
	}
	<-w.Done()
}

// TestLiveWatcherGetsOneResponsePerRevision: a watcher reading the in-memory
// tail sends each revision in its own response headed by that revision, as
// etcd's synced watchers do, even when several revisions piled up while its
// client was slow; one catching up from history gets a batch headed by the
// store's revision, as etcd's unsynced watchers do.
func TestLiveWatcherGetsOneResponsePerRevision(t *testing.T) {
	src := &fakeSource{rev: 1}
	h := newHub(t, src, Options{TailEvents: 100})
	c := &collector{block: make(chan struct{}), entered: make(chan struct{}, 1)}
	if _, err := h.Watch(context.Background(), Request{Key: []byte("k"), End: []byte("l")}, c.sink, nil); err != nil {
		t.Fatal(err)
	}
	src.write(h, "k1")
	<-c.entered // the watcher holds revision 2 in its sink
	src.write(h, "k2")
	src.write(h, "k3")
	close(c.block)
	c.waitUntil(t, "3 events", func(resps []Response) bool { return events(resps) >= 3 })
	c.mu.Lock()
	var got []string
	for _, r := range c.resps {
		got = append(got, fmt.Sprintf("%d:%d", r.Revision, len(r.Events)))
	}
	c.mu.Unlock()
	if want := []string{"2:1", "3:1", "4:1"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("live responses (header:events) %v, want %v", got, want)
	}

	// From a past revision: from the tail (same hub) and from history (a
	// new hub's tail starts after revision 4), one batch headed by the
	// head, then one response per revision once caught up.
	for what, hub := range map[string]*Hub{"tail": h, "history": newHub(t, src, Options{TailEvents: 100})} {
		hc := &collector{}
		if _, err := hub.Watch(context.Background(), Request{Key: []byte("k"), End: []byte("l"), StartRevision: 2}, hc.sink, nil); err != nil {
			t.Fatal(err)
		}
		hc.waitUntil(t, "3 events from "+what, func(resps []Response) bool { return events(resps) >= 3 })
		src.write(hub, "k4")
		hc.waitUntil(t, "the next write", func(resps []Response) bool { return events(resps) >= 4 })
		hc.mu.Lock()
		got = got[:0]
		for _, r := range hc.resps {
			got = append(got, fmt.Sprintf("%d:%d", r.Revision, len(r.Events)))
		}
		hc.mu.Unlock()
		// The history hub's head is revision 4 when it starts (the
		// source's revision then), the tail hub's too.
		if want := []string{"4:3", "5:1"}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("from %s: responses (header:events) %v, want %v", what, got, want)
		}
		src.mu.Lock()
		src.events = src.events[:len(src.events)-1]
		src.rev--
		src.mu.Unlock()
	}
}

// TestTailBoundedByBytes: events of large objects are kept by bytes, not by
// count, and a watcher from below the tail still gets every event once, in
// order, from history.
func TestTailBoundedByBytes(t *testing.T) {
	src := &fakeSource{rev: 1}
	const budget = 16 << 10
	h := newHub(t, src, Options{TailEvents: 1000, TailBytes: budget, BatchEvents: 7})
	value := make([]byte, 1<<10)
	for range 200 {
		src.mu.Lock()
		src.rev++
		ev := &mvccpb.Event{Type: mvccpb.PUT,
			Kv:     &mvccpb.KeyValue{Key: []byte("k"), Value: value, ModRevision: src.rev, CreateRevision: 2, Version: src.rev - 1},
			PrevKv: &mvccpb.KeyValue{Key: []byte("k"), Value: value, ModRevision: src.rev - 1}}
		src.events = append(src.events, ev)
		rev := src.rev
		src.mu.Unlock()
		h.Notify(rev, []*mvccpb.Event{ev})

		h.mu.RLock()
		n, bytes := len(h.tail), h.tailBytes
		var sum int64
		for _, ev := range h.tail {
			sum += eventBytes(ev)
		}
		h.mu.RUnlock()
		if bytes != sum {
			t.Fatalf("tail accounts %d bytes, holds %d", bytes, sum)
		}
		if bytes > 2*budget+eventBytes(ev) || n > 40 {
			t.Fatalf("tail of %d events, %d bytes, over twice its %d-byte bound", n, bytes, budget)
		}
	}
	c := &collector{}
	w, err := h.Watch(context.Background(), Request{Key: []byte("k"), StartRevision: 2}, c.sink, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	c.waitUntil(t, "200 events", func(resps []Response) bool { return events(resps) >= 200 })
	for i, r := range c.revs() {
		if r != int64(i)+2 {
			t.Fatalf("event %d at revision %d", i, r)
		}
	}
}
