package lease

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestExpiryRenewAndLookup(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1000, 0)}
	l := New(Options{Now: clk.Now})
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
	if info, err := l.Lookup(7); err != nil || info.Remaining != 6 || info.TTL != 10 {
		t.Fatalf("lookup %+v %v (remaining rounds up)", info, err)
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

func TestRunRevokesAndRetries(t *testing.T) {
	l := New(Options{})
	l.Grant(1, 0) // already expired: TTL 0 seconds
	var mu sync.Mutex
	calls := 0
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		l.Run(ctx, slog.Default(), func(ctx context.Context, id int64) error {
			mu.Lock()
			defer mu.Unlock()
			calls++
			if calls == 1 {
				return context.DeadlineExceeded // first attempt fails
			}
			l.Revoke(id)
			return nil
		}, 10*time.Millisecond)
		close(done)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for l.Known(1) {
		if time.Now().After(deadline) {
			t.Fatal("expired lease not revoked after a failed attempt")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if calls != 2 {
		t.Fatalf("revoke called %d times, want 2", calls)
	}
}
