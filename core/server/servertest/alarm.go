package servertest

import (
	"context"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/status"
)

// AlarmClient is what the quota and alarm tests call on one endpoint, on
// any engine.
type AlarmClient struct {
	KV    pb.KVClient
	Maint pb.MaintenanceClient
	// Self is the endpoint's member ID.
	Self uint64
}

// NewAlarmClient returns an AlarmClient over c's connection.
func NewAlarmClient(t testing.TB, ctx context.Context, c *clientv3.Client) AlarmClient {
	t.Helper()
	a := AlarmClient{KV: pb.NewKVClient(c.ActiveConnection()), Maint: pb.NewMaintenanceClient(c.ActiveConnection())}
	st, err := a.Maint.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	a.Self = st.Header.MemberId
	return a
}

// Alarm sends an Alarm request for NOSPACE and returns the alarms.
func (a AlarmClient) Alarm(t testing.TB, ctx context.Context, action pb.AlarmRequest_AlarmAction, member uint64) []*pb.AlarmMember {
	t.Helper()
	r, err := a.Maint.Alarm(ctx, &pb.AlarmRequest{Action: action, MemberID: member, Alarm: pb.AlarmType_NOSPACE})
	if err != nil {
		t.Fatalf("alarm %s: %v", action, err)
	}
	return r.Alarms
}

// PutRefused reports whether a Put is refused with etcd's no-space error,
// and fails t on any other error.
func (a AlarmClient) PutRefused(t testing.TB, ctx context.Context) bool {
	t.Helper()
	return a.PutRefusedKey(t, ctx, "k", []byte("v"))
}

// PutRefusedKey is PutRefused for a given key and value.
func (a AlarmClient) PutRefusedKey(t testing.TB, ctx context.Context, key string, val []byte) bool {
	t.Helper()
	_, err := a.KV.Put(ctx, &pb.PutRequest{Key: []byte(key), Value: val})
	return err != nil && a.Refusal(t, err)
}

// Refusal fails t unless err is etcd's no-space error.
func (a AlarmClient) Refusal(t testing.TB, err error) bool {
	t.Helper()
	if want, _ := status.FromError(rpctypes.ErrGRPCNoSpace); status.Convert(err).Message() != want.Message() {
		t.Fatalf("put: %v, want %v", err, rpctypes.ErrGRPCNoSpace)
	}
	return true
}

// HoldsNoSpace reports whether list is exactly member's NOSPACE alarm.
func HoldsNoSpace(list []*pb.AlarmMember, member uint64) bool {
	return len(list) == 1 && list[0].MemberID == member && list[0].Alarm == pb.AlarmType_NOSPACE
}
