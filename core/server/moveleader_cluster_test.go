package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/engramkv/engram/core/internal/etcdapi"
	"github.com/engramkv/engram/internal/etcdtest"
	lin "github.com/engramkv/engram/tests/linearizability"
)

// endpoints lists the client URLs of nodes idx.
func (c *cluster) endpoints(idx ...int) string {
	var eps []string
	for _, i := range idx {
		eps = append(eps, c.nodes[i].Endpoint)
	}
	return strings.Join(eps, ",")
}

// writesEachSide is how many acknowledged writes TestClusterMoveLeader
// waits for before the move and again after it.
const writesEachSide = 10

// TestClusterMoveLeader runs `etcdctl move-leader` as an operator does (the
// endpoints of every member; etcdctl finds the leader by Status) under a
// recorded write and watch load: leadership moves to the named follower,
// and the history (porcupine) shows no acknowledged write lost and every
// read linearizable across the move.
func TestClusterMoveLeader(t *testing.T) {
	t.Parallel()
	etcdtest.Require(t)
	c := startCluster(t, 3)
	from := c.leader(-1)
	to := (from + 1) % 3
	c.following(to, from)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	eps := []string{c.nodes[0].Endpoint, c.nodes[1].Endpoint, c.nodes[2].Endpoint}

	rec := lin.NewRecorder()
	rb, err := lin.NewClient(eps)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	w, err := lin.StartWatcher(ctx, rec, eps)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	load, err := lin.StartLoad(ctx, rec, lin.LoadOptions{Endpoints: eps, Clients: 4, Rate: 200, OpTimeout: 5 * time.Second, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer load.Stop()
	// The history must hold writes on both sides of the move, however
	// fast etcdctl is next to the load's first writes.
	if err := rec.AwaitAcknowledged(ctx, writesEachSide); err != nil {
		t.Fatalf("writes before the move: %v", err)
	}
	if _, err := lin.Readback(ctx, rb, rec, 4, "before the move"); err != nil {
		t.Fatal(err)
	}

	target := fmt.Sprintf("%x", etcdapi.MemberID(c.names[to]))
	moveStart := time.Now()
	out, err := etcdtest.Etcdctl(t, "--endpoints="+c.endpoints(0, 1, 2), "move-leader", target)
	moveTook := time.Since(moveStart)
	if err != nil {
		t.Fatalf("move-leader: %v", err)
	}
	if !strings.Contains(out, "Leadership transferred") {
		t.Fatalf("move-leader printed %q", out)
	}
	// etcdctl returns once the old leader knows the target leads.
	if !c.nodes[to].IsLeader() {
		t.Fatalf("node %d does not lead after move-leader", to)
	}
	c.following(from, to)
	if _, err := lin.Readback(ctx, rb, rec, 4, "after the move"); err != nil {
		t.Fatal(err)
	}
	// Writes go on under the new leader (through every member, as the
	// load's clients spread them).
	if err := rec.AwaitAcknowledged(ctx, rec.Acknowledged()+writesEachSide); err != nil {
		t.Fatalf("writes after the move: %v", err)
	}

	load.Stop()
	final, err := lin.Readback(ctx, rb, rec, 4, "the end of the load")
	if err != nil {
		t.Fatal(err)
	}
	complete := w.WaitFor(ctx, final.Resp.Rev)
	w.Stop()
	h := rec.History()
	h.FinalRev, h.WatchComplete = final.Resp.Rev, complete
	res := lin.Check(h, lin.Options{Timeout: time.Minute})
	t.Logf("%s", res.Summary())
	unknown := map[string]int{}
	for _, op := range h.Ops {
		if op.Resp.Unknown {
			unknown[op.Note]++
		}
	}
	t.Logf("writes with an unknown outcome, by error: %v", unknown)
	// The writes' pause across the move: the slowest acknowledged write
	// (they wait, rather than fail, while leadership changes hands).
	var slowest int64
	for _, op := range h.Ops {
		if _, ok := op.Acknowledged(); ok {
			slowest = max(slowest, op.Return-op.Call)
		}
	}
	t.Logf("etcdctl move-leader took %v (process start included); slowest acknowledged write %v", moveTook.Round(time.Millisecond), time.Duration(slowest).Round(time.Millisecond))
	if !res.OK() {
		path := filepath.Join(t.TempDir(), "history.txt")
		_ = lin.WriteHistory(h, path)
		if data, err := os.ReadFile(path); err == nil && len(data) < 1<<16 {
			t.Logf("history:\n%s", data)
		}
		t.Fatalf("the history across the move fails the check:\n%s", strings.Join(res.Problems, "\n"))
	}
	if res.Stats.Acknowledged == 0 {
		t.Fatal("no write was acknowledged: the check proved nothing")
	}
}

// TestClusterMoveLeaderRefusals: a follower answers etcd's not-leader, and
// an unknown or stopped member is a bad transferee; the leader stays.
func TestClusterMoveLeaderRefusals(t *testing.T) {
	t.Parallel()
	etcdtest.Require(t)
	c := startCluster(t, 3)
	l := c.leader(-1)
	f, dead := (l+1)%3, (l+2)%3
	c.following(f, l)
	c.nodes[dead].Stop()
	for _, tc := range []struct {
		what, eps, target, want string
	}{
		{"sent to a follower", c.nodes[f].Endpoint, fmt.Sprintf("%x", etcdapi.MemberID(c.names[l])), "etcdserver: not leader"},
		{"to an unknown member", c.endpoints(l, f), "1234", "etcdserver: bad leader transferee"},
		{"to a stopped member", c.endpoints(l, f), fmt.Sprintf("%x", etcdapi.MemberID(c.names[dead])), "etcdserver: bad leader transferee"},
	} {
		args := []string{"--endpoints=" + tc.eps, "move-leader", tc.target}
		if tc.what == "sent to a follower" {
			// etcdctl itself refuses endpoints without the leader; a raw
			// client reaching a follower gets the server's answer.
			_, err := c.client(f).MoveLeader(context.Background(), etcdapi.MemberID(c.names[l]))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("move-leader %s: %v, want %q", tc.what, err, tc.want)
			}
			continue
		}
		if _, err := etcdtest.Etcdctl(t, args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("move-leader %s: %v, want %q", tc.what, err, tc.want)
		}
	}
	if !c.nodes[l].IsLeader() {
		t.Fatal("the leader changed after refused moves")
	}
}
