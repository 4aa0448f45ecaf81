package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/engramkv/engram/core/internal/etcdapi"
	"github.com/engramkv/engram/internal/etcdtest"
)

// TestClusterMemberRemove: `etcdctl member remove` of a stopped member,
// sent to a follower (which forwards it), drops it from `member list` on
// every node; removing a running member is refused and an unknown one is
// etcd's member-not-found.
func TestClusterMemberRemove(t *testing.T) {
	t.Parallel()
	etcdtest.Require(t)
	c := startCluster(t, 3)
	l := c.leader(-1)
	f, gone := (l+1)%3, (l+2)%3
	c.following(f, l)
	c.nodes[gone].Stop()
	id := fmt.Sprintf("%x", etcdapi.MemberID(c.names[gone]))

	out, err := etcdtest.Etcdctl(t, "--endpoints="+c.nodes[f].Endpoint, "member", "remove", id)
	if err != nil {
		t.Fatalf("member remove: %v", err)
	}
	if !strings.Contains(out, "Member "+id+" removed") {
		t.Fatalf("member remove printed %q", out)
	}
	for _, i := range []int{l, f} {
		out, err := etcdtest.Etcdctl(t, "--endpoints="+c.nodes[i].Endpoint, "member", "list")
		if err != nil {
			t.Fatalf("member list on node %d: %v", i, err)
		}
		if strings.Contains(out, c.names[gone]) || !strings.Contains(out, c.names[l]) || !strings.Contains(out, c.names[f]) {
			t.Errorf("member list on node %d after removing %s:\n%s", i, c.names[gone], out)
		}
	}

	if _, err := etcdtest.Etcdctl(t, "--endpoints="+c.nodes[l].Endpoint, "member", "remove", id); err == nil || !strings.Contains(err.Error(), "etcdserver: member not found") {
		t.Errorf("removing it again: %v, want member not found", err)
	}
	running := fmt.Sprintf("%x", etcdapi.MemberID(c.names[f]))
	if _, err := etcdtest.Etcdctl(t, "--endpoints="+c.nodes[l].Endpoint, "member", "remove", running); err == nil || !strings.Contains(err.Error(), "is running") {
		t.Errorf("removing a running member: %v, want a refusal", err)
	}
	ml, err := c.client(l).MemberList(context.Background())
	if err != nil || len(ml.Members) != 2 {
		t.Fatalf("member list after the refusals: %+v %v", ml, err)
	}
}
