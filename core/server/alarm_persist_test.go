package server_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/plugins/badger"
)

// alarmClient is what the alarm tests call on one endpoint.
type alarmClient struct {
	kv    pb.KVClient
	maint pb.MaintenanceClient
	self  uint64
}

func newAlarmClient(t *testing.T, ctx context.Context, c *clientv3.Client) alarmClient {
	t.Helper()
	a := alarmClient{kv: pb.NewKVClient(c.ActiveConnection()), maint: pb.NewMaintenanceClient(c.ActiveConnection())}
	st, err := a.maint.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	a.self = st.Header.MemberId
	return a
}

func (a alarmClient) alarm(t *testing.T, ctx context.Context, action pb.AlarmRequest_AlarmAction, member uint64) []*pb.AlarmMember {
	t.Helper()
	r, err := a.maint.Alarm(ctx, &pb.AlarmRequest{Action: action, MemberID: member, Alarm: pb.AlarmType_NOSPACE})
	if err != nil {
		t.Fatalf("alarm %s: %v", action, err)
	}
	return r.Alarms
}

// putRefused reports whether a Put is refused with etcd's no-space error,
// and fails t on any other error.
func (a alarmClient) putRefused(t *testing.T, ctx context.Context) bool {
	t.Helper()
	_, err := a.kv.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte("v")})
	return err != nil && a.refusal(t, err)
}

// refusal fails t unless err is etcd's no-space error.
func (a alarmClient) refusal(t *testing.T, err error) bool {
	t.Helper()
	if want, _ := status.FromError(rpctypes.ErrGRPCNoSpace); status.Convert(err).Message() != want.Message() {
		t.Fatalf("put: %v, want %v", err, rpctypes.ErrGRPCNoSpace)
	}
	return true
}

func holdsNoSpace(list []*pb.AlarmMember, member uint64) bool {
	return len(list) == 1 && list[0].MemberID == member && list[0].Alarm == pb.AlarmType_NOSPACE
}

// TestAlarmSurvivesRestart: a NOSPACE alarm raised on a badger-backed
// server is listed and still refuses writes after the server and the
// engine are restarted, until it is disarmed.
func TestAlarmSurvivesRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	dir := t.TempDir()
	var member uint64
	{
		bs, err := badger.Open(badger.Options{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		srv := servertest.Start(t, servertest.Options{Store: bs})
		a := newAlarmClient(t, ctx, srv.Client(t))
		member = a.self
		if got := a.alarm(t, ctx, pb.AlarmRequest_ACTIVATE, member); !holdsNoSpace(got, member) {
			t.Fatalf("activate answered %v", got)
		}
		if !a.putRefused(t, ctx) {
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
	srv := servertest.Start(t, servertest.Options{Store: bs})
	a := newAlarmClient(t, ctx, srv.Client(t))
	if got := a.alarm(t, ctx, pb.AlarmRequest_GET, 0); !holdsNoSpace(got, member) {
		t.Fatalf("after restart the alarms are %v, want NOSPACE of %x", got, member)
	}
	if !a.putRefused(t, ctx) {
		t.Fatal("after restart a put is accepted under NOSPACE")
	}
	if got := a.alarm(t, ctx, pb.AlarmRequest_DEACTIVATE, member); !holdsNoSpace(got, member) {
		t.Fatalf("deactivate answered %v", got)
	}
	if a.putRefused(t, ctx) {
		t.Fatal("put refused after disarming")
	}
}

// TestClusterAlarm: the leader's alarm is every member's: a follower lists
// it and shows it in Status, refuses (through the leader) the writes it
// refuses, a new leader after a failover enforces it, and a follower's
// disarm is forwarded to the leader.
func TestClusterAlarm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	c := startCluster(t, 3)
	l := c.leader(-1)
	f := (l + 1) % 3
	c.following(f, l)
	leader := newAlarmClient(t, ctx, c.client(l))
	follower := newAlarmClient(t, ctx, c.client(f))
	if got := leader.alarm(t, ctx, pb.AlarmRequest_ACTIVATE, leader.self); !holdsNoSpace(got, leader.self) {
		t.Fatalf("activate answered %v", got)
	}
	if got := follower.alarm(t, ctx, pb.AlarmRequest_GET, 0); !holdsNoSpace(got, leader.self) {
		t.Fatalf("follower lists %v, want the leader's NOSPACE", got)
	}
	st, err := follower.maint.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Errors) != 1 || st.Errors[0] != "memberID:"+strconv.FormatUint(leader.self, 10)+" alarm:NOSPACE " {
		t.Fatalf("follower's Status errors %q", st.Errors)
	}
	if !follower.putRefused(t, ctx) {
		t.Fatal("put through a follower accepted under NOSPACE")
	}

	// A new leader loads the alarm from the store.
	c.nodes[l].Kill()
	nl := c.leader(l)
	c.following(3-l-nl, nl)
	next := newAlarmClient(t, ctx, c.client(nl))
	if !next.putRefused(t, ctx) {
		t.Fatal("the new leader accepts a put under NOSPACE")
	}
	other := newAlarmClient(t, ctx, c.client(3-l-nl))
	if got := other.alarm(t, ctx, pb.AlarmRequest_DEACTIVATE, leader.self); !holdsNoSpace(got, leader.self) {
		t.Fatalf("follower's deactivate answered %v", got)
	}
	if got := next.alarm(t, ctx, pb.AlarmRequest_GET, 0); len(got) != 0 {
		t.Fatalf("after the follower's disarm the leader lists %v", got)
	}
	if other.putRefused(t, ctx) {
		t.Fatal("put refused after disarming")
	}
}
