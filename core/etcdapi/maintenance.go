package etcdapi

import (
	"context"
	"hash/crc32"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/kv"
)

type maintenanceServer struct {
	pb.UnimplementedMaintenanceServer
	s *Services
}

func (m *maintenanceServer) Status(ctx context.Context, r *pb.StatusRequest) (*pb.StatusResponse, error) {
	var size int64
	if sz, ok := m.s.store.(kv.Sizer); ok {
		if n, err := sz.Size(); err == nil {
			size = n
		}
	}
	role := m.s.current()
	rev := role.Backend.Rev()
	return &pb.StatusResponse{
		Header:           m.s.header(rev),
		Version:          m.s.version,
		DbSize:           size,
		DbSizeInUse:      size,
		Leader:           role.LeaderID,
		RaftIndex:        uint64(rev),
		RaftTerm:         1,
		RaftAppliedIndex: uint64(rev),
		StorageVersion:   "3.6.0",
	}, nil
}

func (m *maintenanceServer) Alarm(ctx context.Context, r *pb.AlarmRequest) (*pb.AlarmResponse, error) {
	switch r.Action {
	case pb.AlarmRequest_GET, pb.AlarmRequest_DEACTIVATE:
		// Engram raises no alarms: space is the storage engine's concern.
		return &pb.AlarmResponse{Header: m.s.header(m.s.current().Backend.Rev())}, nil
	default:
		return nil, unimplemented("alarms cannot be activated: Engram raises no alarms (space is managed by the storage engine)")
	}
}

// Hash and HashKV hash the live key-values at a revision (crc32c over key,
// mod revision and value). The values are comparable between Engram members
// on the same store, not with etcd's.
func (m *maintenanceServer) Hash(ctx context.Context, r *pb.HashRequest) (*pb.HashResponse, error) {
	h, rev, err := m.hashAt(ctx, 0)
	if err != nil {
		return nil, err
	}
	return &pb.HashResponse{Header: m.s.header(rev), Hash: h}, nil
}

func (m *maintenanceServer) HashKV(ctx context.Context, r *pb.HashKVRequest) (*pb.HashKVResponse, error) {
	h, rev, err := m.hashAt(ctx, r.Revision)
	if err != nil {
		return nil, err
	}
	return &pb.HashKVResponse{Header: m.s.header(rev), Hash: h, CompactRevision: m.s.current().Backend.CompactRev(), HashRevision: rev}, nil
}

func (m *maintenanceServer) hashAt(ctx context.Context, rev int64) (uint32, int64, error) {
	resp, err := m.s.current().Backend.Range(ctx, &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: rev})
	if err != nil {
		return 0, 0, toGRPC(err)
	}
	if rev == 0 {
		rev = resp.Header.Revision
	}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	var buf [8]byte
	for _, kv := range resp.Kvs {
		_, _ = h.Write(kv.Key)
		for i := range 8 {
			buf[i] = byte(kv.ModRevision >> (8 * i))
		}
		_, _ = h.Write(buf[:])
		_, _ = h.Write(kv.Value)
	}
	return h.Sum32(), rev, nil
}

func (m *maintenanceServer) Defragment(ctx context.Context, r *pb.DefragmentRequest) (*pb.DefragmentResponse, error) {
	return nil, unimplemented("defragment is not supported: the storage engine reclaims space by itself")
}

func (m *maintenanceServer) Snapshot(r *pb.SnapshotRequest, s pb.Maintenance_SnapshotServer) error {
	return unimplemented("snapshot is not supported: back up the storage engine instead")
}

func (m *maintenanceServer) MoveLeader(ctx context.Context, r *pb.MoveLeaderRequest) (*pb.MoveLeaderResponse, error) {
	return nil, unimplemented("move-leader is not supported")
}

func (m *maintenanceServer) Downgrade(ctx context.Context, r *pb.DowngradeRequest) (*pb.DowngradeResponse, error) {
	return nil, unimplemented("downgrade is not supported")
}

type clusterServer struct {
	pb.UnimplementedClusterServer
	s *Services
}

func (c *clusterServer) MemberList(ctx context.Context, r *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	members := []*pb.Member{{ID: c.s.memberID, Name: c.s.name, ClientURLs: c.s.urls}}
	if c.s.members != nil {
		var err error
		if members, err = c.s.members(ctx); err != nil {
			return nil, toGRPC(err)
		}
	}
	return &pb.MemberListResponse{Header: c.s.header(c.s.current().Backend.Rev()), Members: members}, nil
}

func (c *clusterServer) MemberAdd(context.Context, *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	return nil, unimplemented("member changes are not supported: Engram members share one storage engine and need no membership")
}

func (c *clusterServer) MemberRemove(context.Context, *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	return nil, unimplemented("member changes are not supported: Engram members share one storage engine and need no membership")
}

func (c *clusterServer) MemberUpdate(context.Context, *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	return nil, unimplemented("member changes are not supported: Engram members share one storage engine and need no membership")
}

func (c *clusterServer) MemberPromote(context.Context, *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	return nil, unimplemented("member changes are not supported: Engram members share one storage engine and need no membership")
}

// authServer reports authentication as disabled and refuses every user and
// role call: Engram authenticates clients with TLS client certificates.
type authServer struct {
	pb.UnimplementedAuthServer
}

var errAuthUnsupported = unimplemented("user/password authentication is not supported; authenticate clients with TLS client certificates (tls.client-ca-file)")

func (authServer) AuthStatus(ctx context.Context, r *pb.AuthStatusRequest) (*pb.AuthStatusResponse, error) {
	return &pb.AuthStatusResponse{Header: &pb.ResponseHeader{}, Enabled: false}, nil
}

func (authServer) Authenticate(context.Context, *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) AuthEnable(context.Context, *pb.AuthEnableRequest) (*pb.AuthEnableResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) AuthDisable(context.Context, *pb.AuthDisableRequest) (*pb.AuthDisableResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserAdd(context.Context, *pb.AuthUserAddRequest) (*pb.AuthUserAddResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserGet(context.Context, *pb.AuthUserGetRequest) (*pb.AuthUserGetResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserList(context.Context, *pb.AuthUserListRequest) (*pb.AuthUserListResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserDelete(context.Context, *pb.AuthUserDeleteRequest) (*pb.AuthUserDeleteResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserChangePassword(context.Context, *pb.AuthUserChangePasswordRequest) (*pb.AuthUserChangePasswordResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserGrantRole(context.Context, *pb.AuthUserGrantRoleRequest) (*pb.AuthUserGrantRoleResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) UserRevokeRole(context.Context, *pb.AuthUserRevokeRoleRequest) (*pb.AuthUserRevokeRoleResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) RoleAdd(context.Context, *pb.AuthRoleAddRequest) (*pb.AuthRoleAddResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) RoleGet(context.Context, *pb.AuthRoleGetRequest) (*pb.AuthRoleGetResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) RoleList(context.Context, *pb.AuthRoleListRequest) (*pb.AuthRoleListResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) RoleDelete(context.Context, *pb.AuthRoleDeleteRequest) (*pb.AuthRoleDeleteResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) RoleGrantPermission(context.Context, *pb.AuthRoleGrantPermissionRequest) (*pb.AuthRoleGrantPermissionResponse, error) {
	return nil, errAuthUnsupported
}

func (authServer) RoleRevokePermission(context.Context, *pb.AuthRoleRevokePermissionRequest) (*pb.AuthRoleRevokePermissionResponse, error) {
	return nil, errAuthUnsupported
}
