package etcdapi

import (
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// LearnerServes reports whether a learner serves the call fullMethod with
// the request req (nil for a stream), as etcd 3.6's interceptors decide
// (v3rpc/interceptor.go, isRPCSupportedForLearner): Status, serializable
// Range and the Snapshot stream; every other etcd call is refused with
// rpctypes.ErrGRPCNotSupportedForLearner, MemberList included, and a
// client sends it to another member. Engram's own members' calls (the
// election wake-up) and gRPC's own services are not etcd calls and pass.
func LearnerServes(fullMethod string, req any) bool {
	if strings.HasPrefix(fullMethod, "/engram.") || strings.HasPrefix(fullMethod, "/grpc.") {
		return true
	}
	switch r := req.(type) {
	case *pb.StatusRequest:
		return true
	case *pb.RangeRequest:
		return r.Serializable
	case nil:
		return fullMethod == pb.Maintenance_Snapshot_FullMethodName
	}
	return false
}
