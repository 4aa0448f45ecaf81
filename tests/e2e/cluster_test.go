package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/server/servertest"
)

// TestClusterOnPostgresSurvivesLeaderSIGKILL runs three engram processes over
// one PostgreSQL through the postgres.wasm plugin, kills the leader with
// SIGKILL under a write and watch load, and checks that a new leader serves
// writes, no acknowledged write is lost, revisions stay dense, and a watcher
// that resumes from its last revision sees every event once. How long the
// failover took is logged, not asserted: it depends on the machine's load.
// The test's context (three minutes) only guards against a hang.
func TestClusterOnPostgresSurvivesLeaderSIGKILL(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	c := startPostgresCluster(ctx, t, "pg-node", "engram_cluster", 3)
	nodes, cli := c.nodes, c.cli
	leader := c.leaderOf(ctx, -1)

	var (
		mu      sync.Mutex
		acked   = map[string]int64{}
		ackedAt []time.Time
		// ackedMore receives a value after writes were acknowledged.
		ackedMore = make(chan struct{}, 1)
	)
	loadCtx, stopLoad := context.WithCancel(ctx)
	var writers sync.WaitGroup
	for w := range 4 {
		writers.Go(func() {
			for i := 0; loadCtx.Err() == nil; i++ {
				key := fmt.Sprintf("/cluster/w%d/%06d", w, i)
				wctx, cancel := context.WithTimeout(loadCtx, 3*time.Second)
				r, err := cli.Txn(wctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, "v")).Commit()
				cancel()
				if err != nil || !r.Succeeded {
					// A client's retry pause, not a wait for an event: a
					// write that failed against a dead node's connection
					// fails again at once until the client moves on.
					select {
					case <-loadCtx.Done():
					case <-time.After(20 * time.Millisecond):
					}
					continue
				}
				mu.Lock()
				acked[key] = r.Header.Revision
				ackedAt = append(ackedAt, time.Now())
				mu.Unlock()
				select {
				case ackedMore <- struct{}{}:
				default:
				}
			}
		})
	}
	seen := make(chan []int64, 1)
	go func() {
		var revs []int64
		next := int64(2)
		for loadCtx.Err() == nil {
			wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(loadCtx))
			for wr := range cli.Watch(wctx, "/cluster/", clientv3.WithPrefix(), clientv3.WithRev(next)) {
				if wr.Err() != nil {
					break
				}
				for _, ev := range wr.Events {
					revs = append(revs, ev.Kv.ModRevision)
					next = ev.Kv.ModRevision + 1
				}
			}
			cancel()
			// A client's retry pause: the watch ended because its node
			// lost the leader (or died), and watching again before a new
			// leader is elected would end the same way at once.
			select {
			case <-loadCtx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
		seen <- revs
	}()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	waitFor := func(n int) {
		for count() < n {
			select {
			case <-ackedMore:
			case <-ctx.Done():
				t.Fatalf("only %d acknowledged writes: %v", count(), ctx.Err())
			}
		}
	}
	waitFor(200)
	before := count()
	killedAt := time.Now()
	nodes[leader].kill()
	next := c.leaderOf(ctx, leader)
	waitFor(before + 100)
	// Failover time: from the kill to the first write acknowledged after it.
	mu.Lock()
	var failover time.Duration
	for _, at := range ackedAt {
		if at.After(killedAt) && (failover == 0 || at.Sub(killedAt) < failover) {
			failover = at.Sub(killedAt)
		}
	}
	mu.Unlock()
	t.Logf("leader %d killed with SIGKILL; node %d leads; first write acknowledged %v after the kill (lease %v)",
		leader, next, failover.Round(time.Millisecond), clusterLease)
	stopLoad()
	writers.Wait()

	// Read everything back from a surviving node.
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	list, err := nodes[next].client(t).Get(rctx, "/cluster/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	revs := servertest.CheckLoad(t, list.Kvs, &mu, acked)
	got := <-seen
	servertest.CheckWatched(t, got)
	if len(got) < len(revs)/2 {
		t.Fatalf("watcher saw %d of %d events", len(got), len(revs))
	}
	t.Logf("%d writes stored with dense revisions; watcher saw %d events in order", len(revs), len(got))
}
