package server_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/badger"
)

// TestAlarmSurvivesRestart: a NOSPACE alarm raised on a badger-backed
// server is listed and still refuses writes after the server and the
// engine are restarted, until it is disarmed.
func TestAlarmSurvivesRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	dir := t.TempDir()
	var member uint64
	{
		bs, err := badger.Open(badger.Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		srv := servertest.Start(t, bs, servertest.Options{})
		a := servertest.NewAlarmClient(t, ctx, srv.Client(t))
		member = a.Self
		if got := a.Alarm(t, ctx, pb.AlarmRequest_ACTIVATE, member); !servertest.HoldsNoSpace(got, member) {
			t.Fatalf("activate answered %v", got)
		}
		if !a.PutRefused(t, ctx) {
			t.Fatal("put accepted under NOSPACE")
		}
		srv.Stop()
		if err := bs.Close(); err != nil {
			t.Fatal(err)
		}
	}
	bs, err := badger.Open(badger.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bs.Close() })
	srv := servertest.Start(t, bs, servertest.Options{})
	a := servertest.NewAlarmClient(t, ctx, srv.Client(t))
	if got := a.Alarm(t, ctx, pb.AlarmRequest_GET, 0); !servertest.HoldsNoSpace(got, member) {
		t.Fatalf("after restart the alarms are %v, want NOSPACE of %x", got, member)
	}
	if !a.PutRefused(t, ctx) {
		t.Fatal("after restart a put is accepted under NOSPACE")
	}
	if got := a.Alarm(t, ctx, pb.AlarmRequest_DEACTIVATE, member); !servertest.HoldsNoSpace(got, member) {
		t.Fatalf("deactivate answered %v", got)
	}
	if a.PutRefused(t, ctx) {
		t.Fatal("put refused after disarming")
	}
}

// TestClusterAlarm: the leader's alarm is every member's: a follower lists
// it and shows it in Status, refuses (through the leader) the writes it
// refuses, a new leader after a failover enforces it, and a follower's
// disarm is forwarded to the leader.
func TestClusterAlarm(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	c := startCluster(t, 3)
	l := c.leader(-1)
	f := (l + 1) % 3
	c.following(f, l)
	leader := servertest.NewAlarmClient(t, ctx, c.client(l))
	follower := servertest.NewAlarmClient(t, ctx, c.client(f))
	if got := leader.Alarm(t, ctx, pb.AlarmRequest_ACTIVATE, leader.Self); !servertest.HoldsNoSpace(got, leader.Self) {
		t.Fatalf("activate answered %v", got)
	}
	if got := follower.Alarm(t, ctx, pb.AlarmRequest_GET, 0); !servertest.HoldsNoSpace(got, leader.Self) {
		t.Fatalf("follower lists %v, want the leader's NOSPACE", got)
	}
	st, err := follower.Maint.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Errors) != 1 || st.Errors[0] != "memberID:"+strconv.FormatUint(leader.Self, 10)+" alarm:NOSPACE " {
		t.Fatalf("follower's Status errors %q", st.Errors)
	}
	if !follower.PutRefused(t, ctx) {
		t.Fatal("put through a follower accepted under NOSPACE")
	}

	// A new leader loads the alarm from the store.
	c.nodes[l].Kill()
	nl := c.leader(l)
	c.following(3-l-nl, nl)
	next := servertest.NewAlarmClient(t, ctx, c.client(nl))
	if !next.PutRefused(t, ctx) {
		t.Fatal("the new leader accepts a put under NOSPACE")
	}
	other := servertest.NewAlarmClient(t, ctx, c.client(3-l-nl))
	if got := other.Alarm(t, ctx, pb.AlarmRequest_DEACTIVATE, leader.Self); !servertest.HoldsNoSpace(got, leader.Self) {
		t.Fatalf("follower's deactivate answered %v", got)
	}
	if got := next.Alarm(t, ctx, pb.AlarmRequest_GET, 0); len(got) != 0 {
		t.Fatalf("after the follower's disarm the leader lists %v", got)
	}
	if other.PutRefused(t, ctx) {
		t.Fatal("put refused after disarming")
	}
}
