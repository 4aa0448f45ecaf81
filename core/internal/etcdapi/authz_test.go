package etcdapi

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"google.golang.org/grpc/metadata"

	"github.com/engramkv/engram/core/internal/auth"
)

// fakeChecker lets user "u" read keys under "/a/" and "/b", write "/b",
// and records every question asked, so a test sees the whole walk.
type fakeChecker struct {
	on    bool
	asked []string
}

func (f *fakeChecker) Enabled() bool { return f.on }

func (f *fakeChecker) Caller(ctx context.Context) (*auth.Info, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	switch tok := md.Get(rpctypes.TokenFieldNameGRPC); {
	case len(tok) == 0:
		return nil, nil
	case tok[0] == "root" || tok[0] == "u":
		return &auth.Info{Username: tok[0], Revision: 1}, nil
	}
	return nil, rpctypes.ErrGRPCInvalidAuthToken
}

func (f *fakeChecker) IsRangePermitted(ai *auth.Info, key, end []byte) error {
	f.asked = append(f.asked, fmt.Sprintf("read %s..%s", key, end))
	return f.allow(ai, key, end, func(k []byte) bool { return bytes.HasPrefix(k, []byte("/a/")) || bytes.Equal(k, []byte("/b")) })
}

func (f *fakeChecker) IsPutPermitted(ai *auth.Info, key []byte) error {
	f.asked = append(f.asked, fmt.Sprintf("write %s", key))
	return f.allow(ai, key, nil, func(k []byte) bool { return bytes.Equal(k, []byte("/b")) })
}

func (f *fakeChecker) IsDeleteRangePermitted(ai *auth.Info, key, end []byte) error {
	f.asked = append(f.asked, fmt.Sprintf("delete %s..%s", key, end))
	return f.allow(ai, key, end, func(k []byte) bool { return bytes.Equal(k, []byte("/b")) })
}

func (f *fakeChecker) IsAdminPermitted(ai *auth.Info) error {
	f.asked = append(f.asked, "admin")
	if ai.Username == "" {
		return rpctypes.ErrGRPCUserEmpty
	}
	if ai.Username != "root" {
		return rpctypes.ErrGRPCPermissionDenied
	}
	return nil
}

// allow judges a single key (ranges are refused unless root), enough for
// the walk's table.
func (f *fakeChecker) allow(ai *auth.Info, key, end []byte, ok func([]byte) bool) error {
	switch {
	case ai.Username == "":
		return rpctypes.ErrGRPCUserEmpty
	case ai.Username == "root":
		return nil
	case len(end) == 0 && ok(key):
		return nil
	}
	return rpctypes.ErrGRPCPermissionDenied
}

func rng(k, end string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(k), RangeEnd: []byte(end)}}}
}

func cmpKey(k string) *pb.Compare { return &pb.Compare{Key: []byte(k)} }

// TestAuthorizeWalk is the rule itself: which permissions each request
// shape asks for, in etcd's order, and what the caller is answered.
func TestAuthorizeWalk(t *testing.T) {
	leaseKeys := func(id int64) [][]byte {
		if id == 7 {
			return [][]byte{[]byte("/b"), []byte("/c")}
		}
		return nil
	}
	denied := rpctypes.ErrGRPCPermissionDenied
	for _, tc := range []struct {
		name  string
		token string
		need  func(auth.Checker, *auth.Info) error
		asked []string
		err   error
	}{
		{"range allowed", "u", needRange(&pb.RangeRequest{Key: []byte("/a/x")}), []string{"read /a/x.."}, nil},
		{"range refused", "u", needRange(&pb.RangeRequest{Key: []byte("/c")}), []string{"read /c.."}, denied},
		{"range no token", "", needRange(&pb.RangeRequest{Key: []byte("/a/x")}), []string{"read /a/x.."}, rpctypes.ErrGRPCUserEmpty},
		{"range garbage token", "bad", needRange(&pb.RangeRequest{Key: []byte("/a/x")}), nil, rpctypes.ErrGRPCInvalidAuthToken},
		{"put allowed", "u", needPut(&pb.PutRequest{Key: []byte("/b")}, leaseKeys), []string{"write /b"}, nil},
		{"put read-only key", "u", needPut(&pb.PutRequest{Key: []byte("/a/x")}, leaseKeys), []string{"write /a/x"}, denied},
		{"put prev_kv reads", "u", needPut(&pb.PutRequest{Key: []byte("/b"), PrevKv: true}, leaseKeys), []string{"write /b", "read /b.."}, nil},
		{"put on lease holding a refused key", "u", needPut(&pb.PutRequest{Key: []byte("/b"), Lease: 7}, leaseKeys),
			[]string{"write /b", "admin", "write /b", "write /c"}, denied},
		{"root put on that lease", "root", needPut(&pb.PutRequest{Key: []byte("/c"), Lease: 7}, leaseKeys), []string{"write /c", "admin"}, nil},
		{"delete prev_kv reads first", "u", needDelete(&pb.DeleteRangeRequest{Key: []byte("/c"), PrevKv: true}), []string{"read /c.."}, denied},
		{"delete", "u", needDelete(&pb.DeleteRangeRequest{Key: []byte("/b")}), []string{"delete /b.."}, nil},
		{"txn compares then both branches", "u", needTxn(&pb.TxnRequest{
			Compare: []*pb.Compare{cmpKey("/a/x")},
			Success: []*pb.RequestOp{rng("/a/y", "")},
			Failure: []*pb.RequestOp{put("/b")},
		}, leaseKeys), []string{"read /a/x..", "read /a/y..", "write /b"}, nil},
		{"txn refused compare", "u", needTxn(&pb.TxnRequest{Compare: []*pb.Compare{cmpKey("/c")}}, leaseKeys), []string{"read /c.."}, denied},
		{"nested txn refused op in failure branch only", "u", needTxn(&pb.TxnRequest{
			Success: []*pb.RequestOp{put("/b")},
			Failure: []*pb.RequestOp{txn([]*pb.RequestOp{rng("/a/z", "")}, []*pb.RequestOp{del("/c", "")})},
		}, leaseKeys), []string{"write /b", "read /a/z..", "delete /c.."}, denied},
		{"lease revoke no token", "", needLeaseRevoke(7, leaseKeys), nil, rpctypes.ErrGRPCUserEmpty},
		{"lease revoke refused key", "u", needLeaseRevoke(7, leaseKeys), []string{"admin", "write /b", "write /c"}, denied},
		{"lease revoke root", "root", needLeaseRevoke(7, leaseKeys), []string{"admin"}, nil},
		{"lease ttl reads keys", "u", needLeaseReads(leaseKeys, 7), []string{"admin", "read /b..", "read /c.."}, denied},
		{"lease ttl no keys", "u", needLeaseReads(leaseKeys, 8), []string{"admin"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeChecker{on: true}
			s := &Services{auth: f}
			ctx := context.Background()
			if tc.token != "" {
				ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(rpctypes.TokenFieldNameGRPC, tc.token))
			}
			err := s.authorize(ctx, tc.need)
			if err != tc.err {
				t.Errorf("err = %v, want %v", err, tc.err)
			}
			if !slices.Equal(f.asked, tc.asked) {
				t.Errorf("asked %q, want %q", f.asked, tc.asked)
			}
		})
	}
}

// TestAuthorizeOff: with auth off, or no auth state at all, nothing is
// asked and everything passes.
func TestAuthorizeOff(t *testing.T) {
	f := &fakeChecker{}
	for _, s := range []*Services{{auth: f}, {}} {
		if err := s.authorize(context.Background(), needRange(&pb.RangeRequest{Key: []byte("/c")})); err != nil {
			t.Fatal(err)
		}
		if err := s.authorizeAdmin(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if len(f.asked) != 0 {
		t.Fatalf("asked %q with auth off", f.asked)
	}
}

// TestWatchRefusal: etcd's cancel reason is the full gRPC error text.
func TestWatchRefusal(t *testing.T) {
	s := &Services{auth: &fakeChecker{on: true}}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(rpctypes.TokenFieldNameGRPC, "u"))
	got := s.watchRefusal(ctx, &pb.WatchCreateRequest{Key: []byte("/c")})
	if want := "rpc error: code = PermissionDenied desc = etcdserver: permission denied"; got != want {
		t.Fatalf("reason %q, want %q", got, want)
	}
	if !strings.Contains(s.watchRefusal(context.Background(), &pb.WatchCreateRequest{Key: []byte("/a/x")}), "user name is empty") {
		t.Fatal("a watch with no token is not refused as etcd's empty user")
	}
	if got := s.watchRefusal(ctx, &pb.WatchCreateRequest{Key: []byte("/a/x")}); got != "" {
		t.Fatalf("allowed watch refused: %q", got)
	}
}

// TestAdminCalls: membership changes, MoveLeader and Alarm
// activate/deactivate need root; Alarm GET a known caller; others pass.
func TestAdminCalls(t *testing.T) {
	s := &Services{auth: &fakeChecker{on: true}}
	u := metadata.NewIncomingContext(context.Background(), metadata.Pairs(rpctypes.TokenFieldNameGRPC, "u"))
	root := metadata.NewIncomingContext(context.Background(), metadata.Pairs(rpctypes.TokenFieldNameGRPC, "root"))
	for _, tc := range []struct {
		ctx    context.Context
		method string
		req    any
		err    error
	}{
		{u, pb.Cluster_MemberAdd_FullMethodName, &pb.MemberAddRequest{}, rpctypes.ErrGRPCPermissionDenied},
		{root, pb.Cluster_MemberAdd_FullMethodName, &pb.MemberAddRequest{}, nil},
		{context.Background(), pb.Maintenance_MoveLeader_FullMethodName, &pb.MoveLeaderRequest{}, rpctypes.ErrGRPCUserEmpty},
		{u, pb.Maintenance_Alarm_FullMethodName, &pb.AlarmRequest{Action: pb.AlarmRequest_GET}, nil},
		{context.Background(), pb.Maintenance_Alarm_FullMethodName, &pb.AlarmRequest{Action: pb.AlarmRequest_GET}, rpctypes.ErrGRPCUserEmpty},
		{u, pb.Maintenance_Alarm_FullMethodName, &pb.AlarmRequest{Action: pb.AlarmRequest_DEACTIVATE}, rpctypes.ErrGRPCPermissionDenied},
		{u, pb.Cluster_MemberList_FullMethodName, &pb.MemberListRequest{}, nil},
	} {
		var err error
		if IsAdminMethod(tc.method) {
			err = s.AuthorizeAdminCall(tc.ctx, tc.req)
		}
		if err != tc.err {
			t.Errorf("%s %v: err %v, want %v", tc.method, tc.req, err, tc.err)
		}
	}
}

// needPut and needTxn give Put's and Txn's checks the shape of the other
// requests' need functions, for the table above; the server calls them
// through serveWrite (permitsPut, permitsTxn).
func needPut(r *pb.PutRequest, keys leaseKeysFunc) func(auth.Checker, *auth.Info) error {
	return func(c auth.Checker, ai *auth.Info) error { return checkPut(c, ai, keys, r) }
}

func needTxn(r *pb.TxnRequest, keys leaseKeysFunc) func(auth.Checker, *auth.Info) error {
	return func(c auth.Checker, ai *auth.Info) error { return checkTxn(c, ai, keys, r) }
}
