package server

import (
	"context"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// RemoveMember forgets a stopped member: its record goes, so MemberList on
// every node (they all read the records from the store) no longer lists it.
//
// etcd stops a removed member that still runs. Engram members need no
// quorum, and a running member only registers at its start, so removing it
// would leave a node that serves but is listed nowhere; a member that
// answers its Status (the leader itself included) is therefore refused,
// and the operator stops it first. A member that starts again registers
// again, as an etcd member added back would.
func (m membership) RemoveMember(ctx context.Context, id uint64) ([]*pb.Member, error) {
	s := m.s
	member, err := m.find(ctx, id)
	if err != nil {
		return nil, err
	}
	if member == nil {
		return nil, rpctypes.ErrGRPCMemberNotFound
	}
	if member.Name == s.opts.Name || m.probe(ctx, member) == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "engram: member %q (%x) is running; stop it before removing it", member.Name, id)
	}
	fence, err := s.elector.Fence()
	if err != nil {
		return nil, rpctypes.ErrGRPCNotLeader
	}
	if err := s.opts.Store.Commit(ctx, []kv.Op{kv.Delete(coder.MetaKey(memberPrefix + member.Name)), kv.Delete(coder.MetaKey(memberVersionPrefix + member.Name)), fence}); err != nil {
		return nil, fmt.Errorf("remove member %q: %w", member.Name, err)
	}
	s.log.Info("member removed", "member", member.Name, "id", fmt.Sprintf("%x", id))
	return s.members(ctx)
}
