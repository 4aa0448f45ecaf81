package server_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/internal/clock/fakeclock"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
)

// The etcd semantics tests run clientv3 against a server on a fake clock:
// kv_semantics_test.go the key-value API and transactions,
// watch_semantics_test.go watches, lease_semantics_test.go leases and
// restart_test.go what a restart keeps.

// progressInterval is the servers' progress notification interval: it only
// passes when a test advances the fake clock.
const progressInterval = 200 * time.Millisecond

func setup(t *testing.T) (*clientv3.Client, context.Context) {
	t.Helper()
	c, ctx, _ := setupClock(t)
	return c, ctx
}

// setupClock starts a server on a fake clock and returns a client, a
// context that bounds the test, and the clock.
func setupClock(t *testing.T) (*clientv3.Client, context.Context, *fakeclock.Clock) {
	t.Helper()
	clk := fakeclock.New(t, time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	srv := servertest.Start(t, memkv.New(), servertest.Options{ProgressNotifyInterval: progressInterval, Clock: clk})
	// A hang guard, not a measurement: no test here waits on real time.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return srv.Client(t), ctx, clk
}

// must returns a client call's result and fails the test if the call
// returned an error: must(c.Get(ctx, "k"))(t). The call comes first because
// Go passes a call's two results on only as a function's whole argument
// list.
func must[T any](v T, err error) func(testing.TB) T {
	return func(t testing.TB) T {
		t.Helper()
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return v
	}
}

func second[T any](_ T, err error) error { return err }
