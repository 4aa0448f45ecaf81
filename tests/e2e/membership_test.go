package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/engramkv/engram/internal/etcdtest"
)

// TestClusterOnPostgresLearnerSession is an operator's session with etcdctl
// 3.6 against three engram processes over one PostgreSQL: member add
// --learner of a fourth node, which then starts at that URL and takes the
// added member's ID; it serves a serializable read and refuses a write and
// a linearizable read as etcd's learner does; killing the leader elects
// another voting member, never the learner; member promote makes it a
// voting member that serves writes, without a restart; member update moves
// its peer URL; stopped, it is removed.
func TestClusterOnPostgresLearnerSession(t *testing.T) {
	etcdtest.Require(t)
	ctx := testCtx(t, 3*time.Minute)
	c := startPostgresCluster(ctx, t, "pg-learn", "engram_learner", 3)
	leader := c.leaderOf(ctx, -1)
	voters := "--endpoints=" + strings.Join(c.eps, ",")
	ctl := func(args ...string) (string, error) {
		return etcdtest.Etcdctl(t, append([]string{"--dial-timeout=5s", "--command-timeout=20s"}, args...)...)
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := ctl(args...)
		if err != nil {
			t.Fatalf("etcdctl %s: %v", strings.Join(args, " "), err)
		}
		return out
	}
	// said reports whether etcdctl reported the member's change (it pads
	// the ID to 16 columns).
	said := func(out, hexID, change string) bool {
		return regexp.MustCompile(`Member\s+` + hexID + `\s+` + change).MatchString(out)
	}
	refused := func(what, want string, args ...string) {
		t.Helper()
		if out, err := ctl(args...); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %q, %v; want %q", what, out, err, want)
		}
	}

	port := freePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	out := must(voters, "member", "add", "pg-learn-3", "--learner", "--peer-urls="+url)
	m := regexp.MustCompile(`Member\s+([0-9a-f]+) added as learner to cluster`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, `ETCD_NAME="pg-learn-3"`) {
		t.Fatalf("member add printed %q", out)
	}
	hexID := m[1]
	id, err := strconv.ParseUint(hexID, 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	if list := must(voters, "member", "list"); !strings.Contains(list, hexID+", unstarted, , "+url+", , true") {
		t.Fatalf("member list with the learner added:\n%s", list)
	}
	refused("promoting it before it starts", "can only promote a learner member which is in sync with leader", voters, "member", "promote", hexID)
	refused("a second learner", "too many learner members in cluster", voters, "member", "add", "x", "--learner", "--peer-urls=http://127.0.0.1:1")

	learner := c.newNode("pg-learn-3", port)
	c.nodes, c.ids = append(c.nodes, learner), append(c.ids, id)
	at := "--endpoints=" + learner.endpoint
	c.awaitLeader(ctx, leader, 3)
	if list := must(voters, "member", "list"); !strings.Contains(list, hexID+", started, pg-learn-3, "+url+", "+url+", true") {
		t.Fatalf("member list with the learner started:\n%s", list)
	}
	must(voters, "put", "k", "v1")
	if got := must(at, "get", "k", "--consistency=s", "--print-value-only"); got != "v1\n" {
		t.Fatalf("a serializable read on the learner: %q", got)
	}
	refused("a write on the learner", "rpc not supported for learner", at, "put", "k", "v2")
	refused("a linearizable read on the learner", "rpc not supported for learner", at, "get", "k")
	if st := must(at, "endpoint", "status", "-w", "json"); !strings.Contains(st, `"isLearner":true`) || !strings.Contains(st, fmt.Sprintf(`"member_id":%d`, id)) {
		t.Fatalf("the learner's endpoint status: %s", st)
	}

	c.nodes[leader].kill()
	next := c.leaderOf(ctx, leader)
	if next == 3 {
		t.Fatal("the learner was elected")
	}
	c.awaitLeader(ctx, next, 3)
	live := []string{}
	for i, ep := range c.eps {
		if i != leader {
			live = append(live, ep)
		}
	}
	alive := "--endpoints=" + strings.Join(live, ",")

	if out := must(alive, "member", "promote", hexID); !said(out, hexID, "promoted") {
		t.Fatalf("member promote printed %q", out)
	}
	must(at, "put", "k", "v3")
	if got := must(at, "get", "k", "--print-value-only"); got != "v3\n" {
		t.Fatalf("a linearizable read through the promoted member: %q", got)
	}
	if list := must(alive, "member", "list"); !strings.Contains(list, hexID+", started, pg-learn-3, "+url+", "+url+", false") {
		t.Fatalf("member list after the promotion:\n%s", list)
	}

	moved := fmt.Sprintf("http://localhost:%d", port)
	if out := must(alive, "member", "update", hexID, "--peer-urls="+moved); !said(out, hexID, "updated") {
		t.Fatalf("member update printed %q", out)
	}
	if list := must(at, "member", "list"); !strings.Contains(list, hexID+", started, pg-learn-3, "+moved+", "+url+", false") {
		t.Fatalf("member list after the update:\n%s", list)
	}

	learner.stop()
	refused("removing a running member", "is running", alive, "member", "remove", fmt.Sprintf("%x", c.ids[next]))
	if out := must(alive, "member", "remove", hexID); !said(out, hexID, "removed") {
		t.Fatalf("member remove printed %q", out)
	}
	if list := must(alive, "member", "list"); strings.Contains(list, hexID) || strings.Count(list, "\n") != 3 {
		t.Fatalf("member list after the removal:\n%s", list)
	}
}
