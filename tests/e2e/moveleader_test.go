package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/engramkv/engram/internal/pgtest"
	"github.com/engramkv/engram/internal/proctest"
)

// TestClusterOnPostgresMoveLeaderAndMemberRemove runs what an operator runs
// against three engram processes over one PostgreSQL: `etcdctl move-leader`
// with every endpoint moves leadership to the named node (every node's
// Status names it), and `member remove` of a killed node, sent to a
// follower, drops it from `member list` on every node left.
func TestClusterOnPostgresMoveLeaderAndMemberRemove(t *testing.T) {
	plugin := proctest.BuiltFile(t, "../../bin/postgres.wasm", "adaptors")
	pg := pgtest.Start(t)
	cache, err := pgtest.WasmCacheDir(plugin)
	if err != nil {
		t.Fatal(err)
	}
	nodes := make([]*node, 3)
	var eps []string
	for i := range nodes {
		nodes[i] = startNode(t, nodeOptions{args: []string{
			fmt.Sprintf("--name=pg-move-%d", i),
			"--storage.engine=wasm",
			"--storage.wasm.file=" + plugin,
			"--storage.wasm.config=url=" + pg.URL("") + " table=engram_move",
			"--storage.wasm.allowed-addresses=" + pg.Addr,
			"--storage.wasm.cache-dir=" + cache,
			"--cluster.enabled=true",
			fmt.Sprintf("--cluster.lease-duration=%s", clusterLease),
			fmt.Sprintf("--cluster.renew-interval=%s", clusterLease/4),
		}})
		eps = append(eps, nodes[i].endpoint)
	}
	ctx := testCtx(t, 3*time.Minute)
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	// leaders returns each node's view of the leader (0: none or no answer).
	leaders := func() []uint64 {
		out := make([]uint64, len(nodes))
		for i, n := range nodes {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := cli.Status(sctx, n.endpoint)
			cancel()
			if err == nil {
				out[i] = st.Leader
			}
		}
		return out
	}
	ids := make([]uint64, len(nodes))
	for i, n := range nodes {
		st, err := cli.Status(ctx, n.endpoint)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = st.Header.MemberId
	}
	// awaitLeader waits until every node in idx names ids[l] as leader. The
	// election runs inside the processes and Status is a client's only
	// view of it, so it is asked again until the views agree.
	awaitLeader := func(l int, idx ...int) {
		for ctx.Err() == nil {
			views, agree := leaders(), true
			for _, i := range idx {
				agree = agree && views[i] == ids[l]
			}
			if agree {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("nodes %v never agreed that node %d leads: %v", idx, l, ctx.Err())
	}
	leader := -1
	for leader < 0 && ctx.Err() == nil {
		for i, v := range leaders() {
			if v != 0 && v == ids[i] {
				leader = i
			}
		}
		if leader < 0 {
			time.Sleep(50 * time.Millisecond) // as awaitLeader
		}
	}
	if _, err := cli.Put(ctx, "before", "v"); err != nil {
		t.Fatal(err)
	}

	target := (leader + 1) % 3
	out := nodes[0].etcdctl(t, "", "--endpoints="+strings.Join(eps, ","), "move-leader", fmt.Sprintf("%x", ids[target]))
	if !strings.Contains(out, "Leadership transferred") {
		t.Fatalf("move-leader printed %q", out)
	}
	awaitLeader(target, 0, 1, 2)
	if r, err := cli.Get(ctx, "before"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("the write before the move: %+v %v", r, err)
	}
	if _, err := cli.Put(ctx, "after", "v"); err != nil {
		t.Fatalf("a write after the move: %v", err)
	}

	gone, follower := (target+1)%3, (target+2)%3
	nodes[gone].kill()
	id := fmt.Sprintf("%x", ids[gone])
	out = nodes[follower].etcdctl(t, "", "member", "remove", id)
	if !strings.Contains(out, id+" removed") {
		t.Fatalf("member remove printed %q", out)
	}
	for _, i := range []int{target, follower} {
		list := nodes[i].etcdctl(t, "", "member", "list")
		if strings.Contains(list, id) || strings.Count(list, "\n") != 2 {
			t.Errorf("member list on node %d after removing node %d:\n%s", i, gone, list)
		}
	}
}
