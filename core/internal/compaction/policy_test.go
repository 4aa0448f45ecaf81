package compaction

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/engramkv/engram/core/internal/clock/fakeclock"
)

func TestPeriodicTargetsTheRevisionRetentionAgo(t *testing.T) {
	p := Policy{Mode: Periodic, Retention: time.Hour}
	var s sampler
	t0 := time.Unix(0, 0)
	if got := p.target(&s, t0, 100); got != 0 {
		t.Fatalf("no history yet: target %d", got)
	}
	if got := p.target(&s, t0.Add(30*time.Minute), 200); got != 0 {
		t.Fatalf("half the retention: target %d", got)
	}
	if got := p.target(&s, t0.Add(time.Hour), 300); got != 100 {
		t.Fatalf("after an hour: target %d, want the revision an hour ago (100)", got)
	}
	if got := p.target(&s, t0.Add(95*time.Minute), 400); got != 200 {
		t.Fatalf("after 95 minutes: target %d, want 200", got)
	}
}

func TestRevisionTarget(t *testing.T) {
	p := Policy{Mode: Revision, Revisions: 1000}
	if got := p.target(nil, time.Unix(0, 0), 5000); got != 4000 {
		t.Fatalf("target %d", got)
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []Policy{{Mode: "daily"}, {Mode: Periodic}, {Mode: Revision}} {
		if p.Validate() == nil {
			t.Errorf("%+v validated", p)
		}
	}
	if err := (Policy{}).Validate(); err != nil {
		t.Error(err)
	}
}

// target is a Target whose revision grows by 10 each time Run reads it (once
// a run) and whose Compact reports each call on compacted.
type target struct {
	mu        sync.Mutex
	rev       int64
	compact   int64
	compacted chan int64
}

func (t *target) Rev() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rev += 10
	return t.rev
}

func (t *target) CompactRev() int64 { t.mu.Lock(); defer t.mu.Unlock(); return t.compact }

func (t *target) Compact(ctx context.Context, rev int64, wait bool) (int64, error) {
	t.mu.Lock()
	t.compact = rev
	t.mu.Unlock()
	t.compacted <- rev
	return rev, nil
}

// TestRunCompactsEveryInterval runs the periodic policy on a fake clock:
// each run compacts to the revision the store had a retention ago, once
// there is one.
func TestRunCompactsEveryInterval(t *testing.T) {
	t0 := time.Unix(0, 0)
	clk := fakeclock.New(t, t0)
	tg := &target{compacted: make(chan int64, 10)}
	p := Policy{Mode: Periodic, Retention: time.Hour, Interval: 30 * time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Run(ctx, clk, tg, func(error) bool { return false }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	clk.WaitArmed(t0.Add(30 * time.Minute))
	// Runs at 30, 60, ..., 150 minutes see revisions 10, 20, ..., 50; the
	// first two have no revision an hour old.
	clk.Advance(150 * time.Minute)
	var got []int64
	for range 3 {
		select {
		case rev := <-tg.compacted:
			got = append(got, rev)
		case <-time.After(fakeclock.Watchdog): // a hang guard, not a measurement
			t.Fatalf("compacted to %v, then nothing", got)
		}
	}
	cancel()
	<-done
	close(tg.compacted)
	for rev := range tg.compacted {
		got = append(got, rev)
	}
	if !slices.Equal(got, []int64{10, 20, 30}) {
		t.Fatalf("compacted to %v, want [10 20 30]", got)
	}
}
