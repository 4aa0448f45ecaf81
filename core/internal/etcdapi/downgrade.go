package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

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
