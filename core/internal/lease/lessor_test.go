package lease

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/engramkv/engram/core/internal/clock/fakeclock"
)

var t0 = time.Unix(1000, 0)

func TestExpiryRenewAndLookup(t *testing.T) {
	clk := fakeclock.New(t, t0)
	l := New(Options{Clock: clk})
	if got := l.EffectiveTTL(1); got != DefaultMinTTL {
		t.Fatalf("TTL 1 granted as %d, want the minimum %d", got, DefaultMinTTL)
	}
	l.Grant(7, 10)
	l.Attach(7, []byte("b"))
	l.Attach(7, []byte("a"))
	l.Attach(99, []byte("ignored"))
	if keys := l.Keys(7); len(keys) != 2 || string(keys[0]) != "a" {
		t.Fatalf("keys %q", keys)
	}
	clk.Advance(4500 * time.Millisecond)
	if info, err := l.Lookup(7); err != nil || info.Remaining != 5 || info.TTL != 10 {
		t.Fatalf("lookup %+v %v (5.5 s left reads 5: truncated as etcd)", info, err)
	}
	if ttl, err := l.Renew(7); err != nil || ttl != 10 {
		t.Fatal("renew", ttl, err)
	}
	clk.Advance(9 * time.Second)
	if !l.Exists(7) {
		t.Fatal("renewed lease expired early")
	}
	clk.Advance(time.Second)
	if l.Exists(7) || !l.Known(7) {
		t.Fatal("expired lease must not exist but stay known until revoked")
	}
	if _, err := l.Renew(7); err != ErrNotFound {
		t.Fatal("renewing an expired lease", err)
	}
	ids, _ := l.expired()
	if len(ids) != 1 || ids[0] != 7 {
		t.Fatalf("expired %v", ids)
	}
	if again, _ := l.expired(); len(again) != 0 {
		t.Fatal("a lease being revoked was reported twice")
	}
	l.Revoke(7)
	if l.Known(7) || len(l.List()) != 0 {
		t.Fatal("revoked lease still known")
	}
}

// runner runs a Lessor's Run on a fake clock with a revoke that reports each
// call on calls and returns what the test sends on results.
type runner struct {
	t       *testing.T
	clk     *fakeclock.Clock
	l       *Lessor
	calls   chan int64
	results chan error
	stop    func()
}

const retry = time.Second

func startRun(t *testing.T, grant func(*Lessor)) *runner {
	clk := fakeclock.New(t, t0)
	r := &runner{t: t, clk: clk, l: New(Options{Clock: clk}), calls: make(chan int64), results: make(chan error)}
	grant(r.l)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.l.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), func(ctx context.Context, id int64) error {
			select {
			case r.calls <- id:
			case <-ctx.Done():
				return ctx.Err()
			}
			err := <-r.results
			if err == nil {
				r.l.Revoke(id)
			}
			return err
		}, retry)
	}()
	r.stop = func() {
		cancel()
		<-done
	}
	t.Cleanup(r.stop)
	return r
}

// expectCall waits for the next revoke call, which must be for id, and
// answers it with err.
func (r *runner) expectCall(id int64, err error) {
	r.t.Helper()
	select {
	case got := <-r.calls:
		if got != id {
			r.t.Fatalf("revoke(%d), want revoke(%d)", got, id)
		}
		r.results <- err
	case <-time.After(fakeclock.Watchdog): // a hang guard, not a measurement
		r.t.Fatalf("at %v, lease %d was not revoked", r.clk.Now().Sub(t0), id)
	}
}

// expectNoCall checks that Run, waiting for its timer, has not revoked
// anything: with the time not advanced to its timer it cannot have.
func (r *runner) expectNoCall() {
	r.t.Helper()
	select {
	case id := <-r.calls:
		r.t.Fatalf("at %v, lease %d revoked early", r.clk.Now().Sub(t0), id)
	default:
	}
}

// TestRunRevokesAtExpiryAndRetries: Run revokes a lease exactly when it
// expires, and retries a failed revoke after the retry interval.
func TestRunRevokesAtExpiryAndRetries(t *testing.T) {
	r := startRun(t, func(l *Lessor) { l.Grant(1, 10) })
	expiry := t0.Add(10 * time.Second)
	r.clk.WaitArmed(expiry)
	r.clk.AdvanceTo(expiry.Add(-time.Nanosecond))
	r.expectNoCall()
	r.clk.AdvanceTo(expiry)
	r.expectCall(1, errors.New("store unavailable"))

	r.clk.WaitArmed(expiry.Add(retry))
	r.clk.AdvanceTo(expiry.Add(retry - time.Nanosecond))
	r.expectNoCall()
	r.clk.AdvanceTo(expiry.Add(retry))
	r.expectCall(1, nil)
	r.stop()
	if r.l.Known(1) {
		t.Fatal("lease still known after its revocation succeeded")
	}
}

// TestRunRearmsForAnEarlierGrant: a lease granted while Run waits for a
// later expiry is revoked at its own.
func TestRunRearmsForAnEarlierGrant(t *testing.T) {
	r := startRun(t, func(l *Lessor) { l.Grant(1, 100) })
	r.clk.WaitArmed(t0.Add(100 * time.Second))
	r.l.Grant(2, 5)
	r.clk.WaitArmed(t0.Add(5 * time.Second))
	r.clk.Advance(5 * time.Second)
	r.expectCall(2, nil)
	r.clk.WaitArmed(t0.Add(100 * time.Second))
	r.clk.Advance(95 * time.Second)
	r.expectCall(1, nil)
}

// TestListOrder pins etcd's LeaseLeases order: soonest expiry first, a
// renewal moving a lease back, ties by ID, expired leases left out.
func TestListOrder(t *testing.T) {
	clk := fakeclock.New(t, t0)
	l := New(Options{Clock: clk})
	l.Grant(-42, 100)
	l.Grant(9, 30)
	l.Grant(5, 30)
	l.Grant(1, 10)
	check := func(want ...int64) {
		t.Helper()
		got := l.List()
		if len(got) != len(want) {
			t.Fatalf("List() = %v, want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("List() = %v, want %v", got, want)
			}
		}
	}
	check(1, 5, 9, -42)
	clk.Advance(5 * time.Second)
	if _, err := l.Renew(9); err != nil {
		t.Fatal(err)
	}
	check(1, 5, 9, -42)
	if _, err := l.Renew(1); err != nil {
		t.Fatal(err)
	}
	check(1, 5, 9, -42)
	clk.Advance(10 * time.Second)
	check(5, 9, -42)
	if _, err := l.Renew(5); err != nil {
		t.Fatal(err)
	}
	check(9, 5, -42)
}
