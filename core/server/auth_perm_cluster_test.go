package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/core/server/servertest"
)

// TestAuthPermThroughFollower: a restricted user is refused a write and a
// read through a follower exactly as through the leader (the follower
// checks before forwarding; the leader checks the token again). JWT
// tokens, so the leader's tokens are good on the follower too.
func TestAuthPermThroughFollower(t *testing.T) {
	t.Parallel()
	spec := jwtSpec(t)
	c := newCluster(t)
	for i := range 2 {
		c.add(fmt.Sprintf("node%d", i), c.shared, servertest.Options{Auth: server.AuthOptions{Token: spec, BcryptCost: 4}})
	}
	l := c.leader(-1)
	f := 1 - l
	c.following(f, l)
	lctx, lconn := rawConn(t, c.nodes[l].Endpoint)
	tokens := authPermSetup(t, lctx, lconn)
	want := authPermAnswers(t, lctx, lconn, tokens)
	fctx, fconn := rawConn(t, c.nodes[f].Endpoint)
	waitAuthEnabled(t, fctx, pb.NewAuthClient(fconn), tokens["root"])
	got := authPermAnswers(t, fctx, fconn, tokens)
	for _, k := range []string{"u|put /a/x", "u|range /c", "u|put /b", "u|range /a/x", "|put /b", "garbage|put /b"} {
		if got[k] != want[k] || want[k] == "" {
			t.Errorf("%s: follower answers %q, leader %q", k, got[k], want[k])
		}
	}
}

// waitAuthEnabled waits until a member has picked up an `auth enable` made
// through another member: members poll the auth state every
// auth.PollInterval (README, "Authentication"), so there is a change to
// wait for, not a time.
func waitAuthEnabled(t *testing.T, ctx context.Context, ac pb.AuthClient, rootToken string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		st, err := ac.AuthStatus(withToken(ctx, rootToken), &pb.AuthStatusRequest{})
		if err == nil && st.Enabled {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the member never saw auth enabled: last answer %v, %v", st, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
