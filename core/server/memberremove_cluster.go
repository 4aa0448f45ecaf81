package server

import (
	"context"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// RemoveMember forgets a stopped member: its records go, so MemberList on
// every node (they all read the records from the store) no longer lists it.
// A pending member (added, never started) is forgotten unless a node
// claimed it meanwhile.
//
// etcd stops a removed member that still runs. Engram members need no
// quorum, and a running member only registers at its start, so removing it
// would leave a node that serves but is listed nowhere; a member that
// answers its Status (the leader itself included) is therefore refused,
// and the operator stops it first. A member that starts again registers
// again, as a voting member unless a pending member was added for its URL,
// as an etcd member added back would.
func (m membership) RemoveMember(ctx context.Context, id uint64) ([]*pb.Member, error) {
	s := m.s
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	member, _, err := m.findIn(ctx, id)
	if err != nil {
		return nil, err
	}
	if member.Name == "" {
		if err := m.rewrite(ctx, member, nil); err != nil {
			return nil, fmt.Errorf("remove pending member %x: %w", id, err)
		}
		s.log.Info("pending member removed", "id", fmt.Sprintf("%x", id))
		return s.members(ctx)
	}
	if member.Name == s.opts.Name || m.probe(ctx, member) == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "engram: member %q (%x) is running; stop it before removing it", member.Name, id)
	}
	err = m.commitFenced(ctx, kv.Delete(coder.MetaKey(memberPrefix+member.Name)), kv.Delete(attrKey(member.Name)), kv.Delete(coder.MetaKey(memberVersionPrefix+member.Name)))
	if err != nil {
		return nil, fmt.Errorf("remove member %q: %w", member.Name, err)
	}
	s.log.Info("member removed", "member", member.Name, "id", fmt.Sprintf("%x", id))
	return s.members(ctx)
}
