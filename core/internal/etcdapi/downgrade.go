package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// ReleaseHeader is the response header in which Status names the Engram
// release that answers (Options.Release).
const ReleaseHeader = "engram-release"

// sendRelease sets ReleaseHeader on the call's response. It is sent before
// the caller is authorized, so that a member whose token another member
// does not know still learns its release.
func (s *Services) sendRelease(ctx context.Context) {
	if s.release != "" {
		_ = grpc.SetHeader(ctx, metadata.Pairs(ReleaseHeader, s.release))
	}
}

// Downgrader answers etcd's Downgrade RPC and Status's downgrade field from
// the cluster version the server keeps (core/server, downgrade.go). Its
// errors are answered as they are (it returns etcd's gRPC errors).
type Downgrader interface {
	// Downgrade carries out VALIDATE, ENABLE or CANCEL; the response's
	// header is filled here.
	Downgrade(ctx context.Context, r *pb.DowngradeRequest) (*pb.DowngradeResponse, error)
	// DowngradeInfo says whether a downgrade is enabled, and to what.
	DowngradeInfo(ctx context.Context) *pb.DowngradeInfo
}

func (m *maintenanceServer) Downgrade(ctx context.Context, r *pb.DowngradeRequest) (*pb.DowngradeResponse, error) {
	if err := m.s.authorizeAdmin(ctx); err != nil {
		return nil, err
	}
	if m.s.downgrader == nil {
		return nil, unimplemented("downgrade is not supported")
	}
	resp, err := m.s.downgrader.Downgrade(ctx, r)
	if err != nil {
		return nil, toGRPC(err)
	}
	resp.Header = m.s.header(m.s.current().Backend.Rev())
	return resp, nil
}
