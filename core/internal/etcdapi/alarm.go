package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

func (m *maintenanceServer) Alarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	switch r.Action {
	case pb.AlarmRequest_GET, pb.AlarmRequest_DEACTIVATE:
		// Engram raises no alarms: space is the storage engine's concern.
		return &pb.AlarmResponse{Header: m.s.header(m.s.current().Backend.Rev())}, nil
	default:
		return nil, unimplemented("alarms cannot be activated: Engram raises no alarms (space is managed by the storage engine)")
	}
}
