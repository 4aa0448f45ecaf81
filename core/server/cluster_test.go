package server_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/engramkv/engram/core/kv/kvfault"
	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/plugins/memkv"
)

const testLease = time.Second

type cluster struct {
	t      *testing.T
	nodes  []*servertest.Server
	stores []*kvfault.Store
}

// startCluster runs n nodes over one shared in-memory store; each node sees
// the store through its own fault wrapper so a test can partition it.
func startCluster(t *testing.T, n int) *cluster {
	shared := memkv.New()
	c := &cluster{t: t}
	for i := range n {
		st := kvfault.Wrap(shared)
		c.stores = append(c.stores, st)
		c.nodes = append(c.nodes, servertest.Start(t, servertest.Options{
			Store:                  st,
			Name:                   fmt.Sprintf("node%d", i),
			ProgressNotifyInterval: 200 * time.Millisecond,
			Cluster:                &server.ClusterOptions{LeaseDuration: testLease, RenewInterval: testLease / 4},
		}))
	}
	return c
}

func (c *cluster) leader(exclude int) int {
	c.t.Helper()
	deadline := time.Now().Add(10 * testLease)
	for time.Now().Before(deadline) {
		for i, n := range c.nodes {
			if i != exclude && n.IsLeader() {
				return i
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatal("no leader elected")
	return -1
}

func (c *cluster) client(idx ...int) *clientv3.Client {
	var eps []string
	for _, i := range idx {
		eps = append(eps, c.nodes[i].Endpoint)
	}
	cl, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func TestClusterFollowersReadAndForward(t *testing.T) {
	c := startCluster(t, 3)
	l := c.leader(-1)
	f := (l + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fc := c.client(f)
	p, err := fc.Put(ctx, "k", "v") // forwarded
	if err != nil {
		t.Fatal(err)
	}
	g, err := fc.Get(ctx, "k") // served by the follower: sees the acknowledged write
	if err != nil || len(g.Kvs) != 1 || g.Kvs[0].ModRevision != p.Header.Revision {
		t.Fatalf("follower read after forwarded write: %+v %v", g, err)
	}
	lease, err := fc.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.KeepAliveOnce(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	wch := fc.Watch(ctx, "k", clientv3.WithRev(p.Header.Revision))
	if wr := <-wch; len(wr.Events) != 1 || string(wr.Events[0].Kv.Value) != "v" {
		t.Fatalf("forwarded watch: %+v", wr)
	}
	ml, err := fc.MemberList(ctx)
	if err != nil || len(ml.Members) != 3 {
		t.Fatalf("member list: %+v %v", ml, err)
	}
	st, err := fc.Status(ctx, c.nodes[f].Endpoint)
	if err != nil || st.Leader == 0 || st.Leader == st.Header.MemberId {
		t.Fatalf("follower status: %+v %v", st, err)
	}
}

// TestClusterFailover partitions, then kills, the leader under a write and
// watch load and checks: a new leader serves within the lease time, no
// acknowledged write is lost, revisions stay dense, and a watcher that
// re-watches from its last revision sees every event exactly once.
func TestClusterFailover(t *testing.T) {
	c := startCluster(t, 3)
	first := c.leader(-1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := c.client(0, 1, 2)

	var (
		mu    sync.Mutex
		acked = map[string]int64{}
	)
	stop := make(chan struct{})
	var writers sync.WaitGroup
	for w := range 4 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("/load/w%d/%06d", w, i)
				wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
				r, err := cl.Txn(wctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, "v")).Commit()
				wcancel()
				if err == nil && r.Succeeded {
					mu.Lock()
					acked[key] = r.Header.Revision
					mu.Unlock()
				} else {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}

	watched := make(chan []int64, 1)
	go func() {
		var revs []int64
		last := int64(1)
		for ctx.Err() == nil {
			wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
			wch := cl.Watch(wctx, "/load/", clientv3.WithPrefix(), clientv3.WithRev(last+1))
			// Once the writers stopped, the watch ends when it has been
			// quiet for a second: the last events may have arrived before
			// stop, and then no response follows them.
			stopped, quiet := stop, (<-chan time.Time)(nil)
		receive:
			for {
				select {
				case wr, ok := <-wch:
					if !ok || wr.Err() != nil {
						break receive
					}
					for _, ev := range wr.Events {
						revs = append(revs, ev.Kv.ModRevision)
						last = ev.Kv.ModRevision
					}
					if stopped == nil {
						quiet = time.After(time.Second)
					}
				case <-stopped:
					stopped, quiet = nil, time.After(time.Second)
				case <-quiet:
					break receive
				}
			}
			wcancel()
			select {
			case <-stop:
				watched <- revs
				return
			default:
				time.Sleep(50 * time.Millisecond)
			}
		}
		watched <- revs
	}()

	waitWrites := func(n int) {
		t.Helper()
		for {
			mu.Lock()
			got := len(acked)
			mu.Unlock()
			if got >= n {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("only %d acknowledged writes", got)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// failover measures the time from losing the leader to the first write
	// acknowledged by the new one.
	failover := func(lose func(), old int) time.Duration {
		mu.Lock()
		before := len(acked)
		mu.Unlock()
		start := time.Now()
		lose()
		next := c.leader(old)
		waitWrites(before + 20)
		d := time.Since(start)
		t.Logf("leader %d lost; node %d leads; writes resumed after %v", old, next, d)
		return d
	}
	waitWrites(100)
	d1 := failover(func() { c.stores[first].Partition(errors.New("partitioned")) }, first)
	second := c.leader(first)
	c.stores[first].Heal() // it rejoins as a follower
	waitWrites(len(acked) + 50)
	d2 := failover(func() { c.nodes[second].Kill() }, second)
	for _, d := range []time.Duration{d1, d2} {
		if d > 10*testLease {
			t.Errorf("failover took %v with a %v lease", d, testLease)
		}
	}
	close(stop)
	writers.Wait()

	// Every acknowledged write is there with its revision; revisions of all
	// keys are dense.
	survivor := c.leader(second)
	sc := c.client(survivor)
	list, err := sc.Get(ctx, "/load/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	revs := servertest.CheckLoad(t, list.Kvs, &mu, acked)
	t.Logf("%d keys, head revision %d", len(revs), list.Header.Revision)
	if int64(len(revs)+1) != list.Header.Revision {
		t.Fatalf("head revision %d after %d writes", list.Header.Revision, len(revs))
	}
	// The watcher saw each revision once, in order, across both failovers.
	got := <-watched
	servertest.CheckWatched(t, got)
	if len(got) < len(revs)*9/10 {
		t.Fatalf("watcher saw %d of %d events before stopping", len(got), len(revs))
	}
}

func TestClusterNoLeaderAnswer(t *testing.T) {
	c := startCluster(t, 2)
	l := c.leader(-1)
	f := 1 - l
	cl := c.client(f)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// First the follower knows the leader and forwards.
	for {
		if _, err := cl.Put(clientv3.WithRequireLeader(ctx), "x", "y"); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("forwarded write never succeeded: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// With the store unreachable nobody can lead; the follower answers
	// "no leader" to requests that require one.
	c.stores[l].Partition(errors.New("partitioned"))
	c.stores[f].Partition(errors.New("partitioned"))
	deadline := time.Now().Add(10 * testLease)
	for {
		rctx, rcancel := context.WithTimeout(clientv3.WithRequireLeader(context.Background()), time.Second)
		_, err := cl.Put(rctx, "x", "z")
		rcancel()
		if errors.Is(err, rpctypes.ErrNoLeader) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 'no leader' answer; last error %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
