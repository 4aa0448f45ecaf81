package tikv_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pingcap/failpoint"
	"github.com/tikv/client-go/v2/oracle"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvtest"
	"github.com/engramkv/engram/engines/tikv"
	"github.com/engramkv/engram/engines/tikv/tikvmock"
	"github.com/engramkv/engram/engines/tikv/tikvmock/tikvserve"
)

// startFake serves a fresh mock cluster of ten regions (tikvmock's
// default splits, in the default namespace), each with three peers, over
// gRPC. It fails the test if a client called something the fake does not
// serve.
func startFake(t testing.TB, leaderMoveDelay time.Duration) *tikvserve.Server {
	t.Helper()
	c, err := tikvmock.NewCluster(tikvmock.SplitKeys([]byte(tikvmock.DefaultPrefix), tikvmock.DefaultSplits)...)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := tikvserve.New(c, tikvserve.Options{LeaderMoveDelay: leaderMoveDelay})
	if err != nil {
		_ = c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Close()
		_ = c.Close()
		if m := srv.Unimplemented(); len(m) > 0 {
			t.Errorf("the clients called methods the fake answered Unimplemented: %v", m)
		}
	})
	return srv
}

// openGRPC opens the adaptor the production way, tikv.Open with the
// fake's PD address: the PD client, the safe point KV over etcd's API and
// client-go's RPC client all go over the network.
func openGRPC(t testing.TB, srv *tikvserve.Server, opts tikv.Options) *tikv.Store {
	t.Helper()
	opts.PDEndpoints = []string{srv.PDAddr()}
	if len(opts.Prefix) == 0 {
		opts.Prefix = []byte(tikvmock.DefaultPrefix)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := tikv.Open(ctx, opts)
	if err != nil {
		t.Fatalf("tikv.Open against the fake: %v", err)
	}
	return s
}

// TestConformanceOverGRPC runs the adaptor contract through tikv.Open
// against the mock served over gRPC (tikvserve), one fake per case.
func TestConformanceOverGRPC(t *testing.T) {
	kvtest.Run(t, func(t *testing.T) kv.Store { return openGRPC(t, startFake(t, 0), tikv.Options{}) })
}

// realLiveness turns off, for one test, the failpoint that makes every
// store reachable (TestMain): the fake's stores have addresses and a
// health service, so client-go probes them as it probes TiKV, and finds a
// stopped one unreachable.
func realLiveness(t *testing.T) {
	if err := failpoint.Disable("tikvclient/injectLiveness"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := failpoint.Enable("tikvclient/injectLiveness", `return("reachable")`); err != nil {
			t.Errorf("enable failpoint: %v", err)
		}
	})
}

// acked records the writes a store acknowledged.
type acked struct {
	mu   sync.Mutex
	vals map[string]string
}

func (a *acked) put(ctx context.Context, s kv.Store, key, val string) error {
	if err := s.Commit(ctx, []kv.Op{kv.Put([]byte(key), []byte(val))}); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.vals == nil {
		a.vals = map[string]string{}
	}
	a.vals[key] = val
	return nil
}

// putAll writes spread(i) for i in [from, to) one by one, each of which
// must be acknowledged.
func (a *acked) putAll(ctx context.Context, t *testing.T, s kv.Store, from, to int, val string) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := a.put(ctx, s, spread(i), val); err != nil {
			t.Fatalf("write %d (%s): %v", i, val, err)
		}
	}
}

// check reads every acknowledged write back from s.
func (a *acked) check(ctx context.Context, t *testing.T, s kv.Store) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, want := range a.vals {
		got, err := s.Get(ctx, []byte(k))
		if err != nil || string(got) != want {
			t.Errorf("acknowledged write %q=%q reads back %q, %v", k, want, got, err)
		}
	}
	t.Logf("%d acknowledged writes read back", len(a.vals))
}

// spread is a key of each region of startFake's cluster in turn.
func spread(i int) string {
	starts := []string{"a", "c", "cw/09", "h", "p/06", "p/11", "p/16", "snap/9", "u", "\x81"}
	return fmt.Sprintf("%s/%04d", starts[i%len(starts)], i)
}

// TestOverGRPCRestart stops the whole fake (PD and every store, every
// connection dropped) and starts it again under a writer: while it is
// down nothing is acknowledged, after it writes succeed again, and every
// write acknowledged before, during or after is there.
func TestOverGRPCRestart(t *testing.T) {
	realLiveness(t)
	srv := startFake(t, 0)
	s := openGRPC(t, srv, tikv.Options{RequestTimeout: 5 * time.Second})
	defer s.Close()
	ctx := t.Context()
	var a acked
	a.putAll(ctx, t, s, 0, 20, "before the stop")

	// A writer runs through the stop and start; what it gets acknowledged
	// must survive.
	stopped := make(chan struct{})
	done := make(chan int, 1)
	go func() {
		n := 0
		defer func() { done <- n }()
		for i := 100; ; i++ {
			select {
			case <-stopped:
				return
			default:
			}
			if a.put(ctx, s, spread(i), "during") == nil {
				n++
			}
		}
	}()
	defer func() {
		select {
		case <-stopped:
		default:
			close(stopped) // the test failed before the writer was stopped
			<-done
		}
	}()
	srv.Stop()
	down, cancel := context.WithTimeout(ctx, 2*time.Second)
	err := s.Commit(down, []kv.Op{kv.Put([]byte(spread(20)), []byte("down"))})
	cancel()
	if err == nil {
		t.Error("a write was acknowledged while PD and every store were down")
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// The first write after the start waits for the clients to reconnect
	// (gRPC's backoff, which grows while the fake is down); each attempt
	// has the request timeout. The two minutes only guard against a hang:
	// on a loaded machine the reconnection has taken over 30 s.
	started := time.Now()
	deadline, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		err := a.put(deadline, s, spread(21), "after")
		if err == nil {
			break
		}
		if deadline.Err() != nil {
			t.Fatalf("no write succeeded within 2 minutes of the restart: %v", err)
		}
	}
	t.Logf("the first write after the start succeeded %v after it", time.Since(started).Round(time.Millisecond))
	close(stopped)
	t.Logf("the writer got %d writes acknowledged across the restart", <-done)
	a.putAll(ctx, t, s, 22, 40, "after the restart")
	a.check(ctx, t, s)

	// A client opened after the restart sees the same data.
	s2 := openGRPC(t, srv, tikv.Options{})
	defer s2.Close()
	a.check(ctx, t, s2)
}

// TestOverGRPCStoreStop stops the store that leads every region (the
// mock's first) and starts it again: writes sent while its regions have no
// reachable leader succeed once the leaders moved to the other stores,
// writes after that go to the new leaders, and every acknowledged write
// is there after the store is back.
func TestOverGRPCStoreStop(t *testing.T) {
	realLiveness(t)
	srv := startFake(t, 300*time.Millisecond)
	s := openGRPC(t, srv, tikv.Options{RequestTimeout: 20 * time.Second})
	defer s.Close()
	ctx := t.Context()
	var a acked
	a.putAll(ctx, t, s, 0, 20, "before the stop")
	stores := srv.Stores()
	first := stores[0]
	if n := srv.Leaders()[first]; n != 10 {
		t.Fatalf("store %d leads %d regions, want all 10 (leaders %v)", first, n, srv.Leaders())
	}
	before := map[uint64]int64{}
	for _, id := range stores {
		before[id] = srv.Served(id)
	}

	moved, err := srv.StopStore(first)
	if err != nil {
		t.Fatal(err)
	}
	// Sent before the leaders moved: client-go meets the dead store, tries
	// the other peers (NotLeader) and retries until a leader answers.
	if err := a.put(ctx, s, spread(20), "stopped"); err != nil {
		t.Fatalf("write while the store was down: %v", err)
	}
	<-moved
	if n := srv.Leaders()[first]; n != 0 {
		t.Fatalf("the stopped store still leads %d regions", n)
	}
	a.putAll(ctx, t, s, 21, 40, "after the leaders moved")
	var others int64
	for _, id := range stores[1:] {
		others += srv.Served(id) - before[id]
	}
	if others == 0 {
		t.Error("no command reached the stores that took over the leadership")
	}
	if err := srv.StartStore(first); err != nil {
		t.Fatal(err)
	}
	a.putAll(ctx, t, s, 40, 50, "after the store came back")
	a.check(ctx, t, s)
	if err := s.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Close: %v", err)
	}
}

// TestGCOverGRPC runs the adaptor's GC through the fake: the service safe
// point and the cluster's GC safe point go to PD over gRPC, and the lock
// scan before it to every region's store.
func TestGCOverGRPC(t *testing.T) {
	srv := startFake(t, 0)
	s := openGRPC(t, srv, tikv.Options{})
	defer s.Close()
	ctx := t.Context()
	for _, v := range []string{"v1", "v2"} {
		if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("gc/k"), []byte(v))}); err != nil {
			t.Fatal(err)
		}
	}
	before := time.Now()
	sp, err := s.GC(ctx, time.Second)
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	if at := oracle.GetTimeFromTS(sp); at.After(before) || at.Before(before.Add(-time.Minute)) {
		t.Errorf("GC safe point at %v, want about %v", at, before.Add(-time.Second))
	}
	if v, err := s.Get(ctx, []byte("gc/k")); err != nil || string(v) != "v2" {
		t.Errorf("Get after GC = %q, %v; want v2", v, err)
	}
}

// TestSizeOverGRPC: Size asks PD's HTTP API, on the PD endpoint the
// client uses (the fake serves it beside PD's gRPC, as PD does), for the
// namespace's region statistics: the production path, over the network,
// from memcomparable-encoded bounds to MiB.
func TestSizeOverGRPC(t *testing.T) {
	srv := startFake(t, 0)
	s := openGRPC(t, srv, tikv.Options{})
	defer s.Close()
	ctx := t.Context()
	val := make([]byte, 64<<10)
	for i := range 40 { // 2.5 MiB
		if err := s.Commit(ctx, []kv.Op{kv.Put(fmt.Appendf(nil, "size/%03d", i), val)}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.Size()
	if err != nil {
		t.Fatalf("Size through PD's HTTP API: %v", err)
	}
	// The fake rounds the mock's exact total up to whole MiB, as PD's
	// per-region sizes are: 2.5 MiB of values and their keys read 3 MiB.
	if n != 3<<20 {
		t.Errorf("Size = %d bytes, want 3 MiB", n)
	}
}
