package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestClusterOnPostgresMoveLeaderAndMemberRemove runs what an operator runs
// against three engram processes over one PostgreSQL: `etcdctl move-leader`
// with every endpoint moves leadership to the named node (every node's
// Status names it), and `member remove` of a killed node, sent to a
// follower, drops it from `member list` on every node left.
func TestClusterOnPostgresMoveLeaderAndMemberRemove(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	c := startPostgresCluster(ctx, t, "pg-move", "engram_move", 3)
	nodes, eps, ids, cli := c.nodes, c.eps, c.ids, c.cli
	leader := c.leaderOf(ctx, -1)
	if _, err := cli.Put(ctx, "before", "v"); err != nil {
		t.Fatal(err)
	}

	target := (leader + 1) % 3
	out := nodes[0].etcdctl(t, "", "--endpoints="+strings.Join(eps, ","), "move-leader", fmt.Sprintf("%x", ids[target]))
	if !strings.Contains(out, "Leadership transferred") {
		t.Fatalf("move-leader printed %q", out)
	}
	c.awaitLeader(ctx, target, 0, 1, 2)
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
