package server_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/server/servertest"
)

func TestClusterFollowersReadAndForward(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3)
	l := c.leader(-1)
	f := (l + 1) % 3
	c.following(f, l)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
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

// acks records the writes acknowledged under a load, so a test can wait
// for the next ones.
type acks struct {
	mu      sync.Mutex
	revs    map[string]int64
	changed chan struct{} // closed and replaced at each acknowledgement
}

func newAcks() *acks { return &acks{revs: map[string]int64{}, changed: make(chan struct{})} }

func (a *acks) add(key string, rev int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.revs[key] = rev
	close(a.changed)
	a.changed = make(chan struct{})
}

func (a *acks) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.revs)
}

// waitFor waits until n writes were acknowledged.
func (a *acks) waitFor(ctx context.Context, t *testing.T, n int) {
	t.Helper()
	for {
		a.mu.Lock()
		got, changed := len(a.revs), a.changed
		a.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("only %d acknowledged writes, waiting for %d", got, n)
		}
	}
}

// TestClusterFailover partitions, then kills, the leader under a write and
// watch load and checks the outcome: another node takes over and writes
// resume, no acknowledged write is lost, revisions stay dense, and a watcher
// that re-watches from its last revision sees every event exactly once.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3)
	first := c.leader(-1)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	cl := c.client(0, 1, 2)

	acked := newAcks()
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
				// A write that meets no leader waits for one, in real
				// time (etcdapi's reroute.go): a partitioned node knows
				// none until the test heals it. The deadline keeps such a
				// writer from stalling the load for the whole wait; a
				// write it cuts short is only not counted.
				wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
				r, err := cl.Txn(wctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, "v")).Commit()
				wcancel()
				if err == nil && r.Succeeded {
					acked.add(key, r.Header.Revision)
					continue
				}
				// A write refused at once (a partitioned leader's store
				// fails): pause before the next, so that four writers do
				// not spin. This paces the load; no outcome waits on it.
				select {
				case <-time.After(20 * time.Millisecond):
				case <-stop:
					return
				}
			}
		}()
	}

	// The watcher follows the load until it has seen the head revision the
	// test sends once the writers stopped, watching again from its last
	// revision whenever a failover ends its watch.
	head := make(chan int64, 1)
	watched := make(chan []int64, 1)
	go func() {
		var revs []int64
		last, goal := int64(1), int64(math.MaxInt64)
		for ctx.Err() == nil && last < goal {
			wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
			wch := cl.Watch(wctx, "/load/", clientv3.WithPrefix(), clientv3.WithRev(last+1))
		receive:
			for last < goal {
				select {
				case wr, ok := <-wch:
					if !ok || wr.Err() != nil {
						break receive
					}
					for _, ev := range wr.Events {
						revs = append(revs, ev.Kv.ModRevision)
						last = ev.Kv.ModRevision
					}
				case goal = <-head:
				}
			}
			wcancel()
			if last < goal {
				// A watch refused for want of a leader ends at once: pause
				// before watching again, so as not to spin.
				select {
				case <-time.After(50 * time.Millisecond):
				case <-ctx.Done():
				}
			}
		}
		watched <- revs
	}()

	lose := func(lost func(), old int) int {
		t.Helper()
		before := acked.count()
		lost()
		next := c.failover(old)
		acked.waitFor(ctx, t, before+20)
		t.Logf("leader %d lost; node %d leads; writes resumed", old, next)
		return next
	}
	acked.waitFor(ctx, t, 100)
	second := lose(func() { c.stores[first].Partition(errors.New("partitioned")) }, first)
	// Healed, it rejoins as a follower at its next round. Until then,
	// the writes it gets wait for a leader (a real-time bound) and fail.
	c.stores[first].Heal()
	c.following(first, second)
	acked.waitFor(ctx, t, acked.count()+50)
	lose(func() { c.nodes[second].Kill() }, second)
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
	revs := servertest.CheckLoad(t, list.Kvs, &acked.mu, acked.revs)
	t.Logf("%d keys, head revision %d", len(revs), list.Header.Revision)
	if int64(len(revs)+1) != list.Header.Revision {
		t.Fatalf("head revision %d after %d writes", list.Header.Revision, len(revs))
	}
	// The watcher saw each revision once, in order, across both failovers.
	head <- list.Header.Revision
	got := <-watched
	servertest.CheckWatched(t, got)
	if len(got) != len(revs) {
		t.Fatalf("watcher saw %d of %d events", len(got), len(revs))
	}
}

// TestClusterNoLeaderAnswer: a follower forwards while it knows the leader,
// and answers "no leader" to requests that require one once it knows none.
func TestClusterNoLeaderAnswer(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 2)
	l := c.leader(-1)
	f := 1 - l
	c.following(f, l)
	cl := c.client(f)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if _, err := cl.Put(clientv3.WithRequireLeader(ctx), "x", "y"); err != nil {
		t.Fatalf("forwarded write: %v", err)
	}
	// With the store unreachable nobody can lead.
	c.stores[l].Partition(errors.New("partitioned"))
	c.stores[f].Partition(errors.New("partitioned"))
	c.await(fmt.Sprintf("node %d knowing no leader", f), func() bool {
		_, ok := c.nodes[f].Leader()
		return !ok
	})
	if _, err := cl.Put(clientv3.WithRequireLeader(ctx), "x", "z"); !errors.Is(err, rpctypes.ErrNoLeader) {
		t.Fatalf("write requiring a leader while none is known: %v, want %v", err, rpctypes.ErrNoLeader)
	}
}
