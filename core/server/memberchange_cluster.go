package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/kv"
	release "github.com/engramkv/engram/core/version"
)

// maxLearners is etcd 3.6's default --max-learners: one learner at a time.
const maxLearners = 1

// membershipRelease is the first release that reads the records of
// member add, update and promote (members.go): a 0.9 member would list an
// added member under its name's hash, skip a pending one and let a learner
// campaign. The changes wait until every member runs it, and are refused
// while a downgrade below it is enabled (clusterversion.go).
var membershipRelease = release.Version{Major: 0, Minor: 10}

// errMemberChanged answers a member change whose records another change
// moved between the check and the commit; running it again decides anew.
var errMemberChanged = status.Error(codes.Aborted, "engram: the member records changed during the request; retry it")

// AddMember records a pending member under a fresh ID, as etcd's member
// add does: it has no name and no client URLs until a node starts
// advertising one of peerURLs and claims it (register, members.go). Its
// peer URLs must be unused, and there may be only maxLearners learners.
func (m membership) AddMember(ctx context.Context, peerURLs []string, learner bool) (*pb.Member, []*pb.Member, error) {
	s := m.s
	// Before the lock: the gate asks every member for its release.
	if err := s.requireClusterVersion(ctx, "member add", membershipRelease); err != nil {
		return nil, nil, err
	}
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	members, err := s.members(ctx)
	if err != nil {
		return nil, nil, err
	}
	if usedPeerURL(members, 0, peerURLs) {
		return nil, nil, rpctypes.ErrGRPCPeerURLExist
	}
	if learner && countLearners(members) >= maxLearners {
		return nil, nil, rpctypes.ErrGRPCTooManyLearners
	}
	id, err := freshID(members)
	if err != nil {
		return nil, nil, err
	}
	added := memberAttrs{ID: id, PeerURLs: peerURLs, Learner: learner}
	if err := m.commitFenced(ctx, kv.PutIfAbsent(pendingKey(id), added.encode())); err != nil {
		return nil, nil, fmt.Errorf("add member: %w", err)
	}
	s.log.Info("member added", "id", fmt.Sprintf("%x", id), "peer-urls", peerURLs, "learner", learner)
	members, err = s.members(ctx)
	if err != nil {
		return nil, nil, err
	}
	return &pb.Member{ID: id, PeerURLs: peerURLs, IsLearner: learner}, members, nil
}

// UpdateMember moves a member's peer URLs: where the others reach it, and
// where followers forward while it leads. The record keeps them across
// the member's restarts. A running member is woken to read its record at
// once (a leader's next renewal then names the new URL); the leader takes
// its own new URL at once.
func (m membership) UpdateMember(ctx context.Context, id uint64, peerURLs []string) ([]*pb.Member, error) {
	s := m.s
	target, members, unlock, err := m.lockMember(ctx, "member update", id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if usedPeerURL(members, id, peerURLs) {
		return nil, rpctypes.ErrGRPCPeerURLExist
	}
	if err := m.rewrite(ctx, target, func(a *memberAttrs) { a.PeerURLs = peerURLs }); err != nil {
		return nil, fmt.Errorf("update member %x: %w", id, err)
	}
	s.log.Info("member updated", "id", fmt.Sprintf("%x", id), "name", target.Name, "peer-urls", peerURLs)
	switch target.Name {
	case "":
	case s.opts.Name:
		s.refreshSelf(ctx)
	default:
		s.wakePeer(ctx, target.Name, peerURLs[0])
	}
	return s.members(ctx)
}

// PromoteMember makes a learner a voting member. As in etcd, only a
// learner that is in sync may be promoted: here, one that runs (answers
// its Status), since every member reads the same store. The leader wakes
// it so it serves as a follower and campaigns from now on, without a
// restart.
func (m membership) PromoteMember(ctx context.Context, id uint64) ([]*pb.Member, error) {
	s := m.s
	target, _, unlock, err := m.lockMember(ctx, "member promote", id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if !target.IsLearner {
		return nil, rpctypes.ErrGRPCMemberNotLearner
	}
	if target.Name == "" || m.probe(ctx, target) != nil {
		return nil, rpctypes.ErrGRPCLearnerNotReady
	}
	if err := m.rewrite(ctx, target, func(a *memberAttrs) { a.Learner = false }); err != nil {
		return nil, fmt.Errorf("promote member %x: %w", id, err)
	}
	s.log.Info("member promoted", "id", fmt.Sprintf("%x", id), "name", target.Name)
	s.wakePeer(ctx, target.Name, target.PeerURLs[0])
	return s.members(ctx)
}

// lockMember passes the cluster-version gate of the member change what
// (before the lock: the gate asks every member for its release), takes
// memberMu and finds member id as findIn does. Unless it fails, the caller
// calls unlock once done.
func (m membership) lockMember(ctx context.Context, what string, id uint64) (target *pb.Member, members []*pb.Member, unlock func(), err error) {
	if err := m.s.requireClusterVersion(ctx, what, membershipRelease); err != nil {
		return nil, nil, nil, err
	}
	m.s.memberMu.Lock()
	if target, members, err = m.findIn(ctx, id); err != nil {
		m.s.memberMu.Unlock()
		return nil, nil, nil, err
	}
	return target, members, m.s.memberMu.Unlock, nil
}

// findIn returns the member id and the members, or etcd's member not
// found.
func (m membership) findIn(ctx context.Context, id uint64) (*pb.Member, []*pb.Member, error) {
	members, err := m.s.members(ctx)
	if err != nil {
		return nil, nil, err
	}
	for _, mb := range members {
		if mb.ID == id {
			return mb, members, nil
		}
	}
	return nil, nil, rpctypes.ErrGRPCMemberNotFound
}

// rewrite changes the attributes of target (a started or a pending
// member) with change, conditional on its record being as read; a nil
// change deletes a pending member's record.
func (m membership) rewrite(ctx context.Context, target *pb.Member, change func(*memberAttrs)) error {
	key := pendingKey(target.ID)
	if target.Name != "" {
		key = attrKey(target.Name)
	}
	cur, err := m.s.opts.Store.Get(ctx, key)
	switch {
	case errors.Is(err, kv.ErrNotFound) && target.Name != "":
		// A member from before memberattr records: its first one.
		a := memberAttrs{ID: target.ID}
		change(&a)
		return m.commitFenced(ctx, kv.PutIfAbsent(key, a.encode()))
	case errors.Is(err, kv.ErrNotFound):
		return errMemberChanged // claimed or removed meanwhile
	case err != nil:
		return err
	}
	if change == nil {
		return m.commitFenced(ctx, kv.CompareAndDelete(key, cur))
	}
	a, err := decodeAttrs(cur)
	if err != nil {
		return err
	}
	change(&a)
	return m.commitFenced(ctx, kv.CompareAndSwap(key, cur, a.encode()))
}

// commitFenced commits ops with the election's fence: a node that no
// longer leads changes no member. A conflict on a member record means
// another change (a claim at a node's start) came first.
func (m membership) commitFenced(ctx context.Context, ops ...kv.Op) error {
	fence, err := m.s.elector.Fence()
	if err != nil {
		return rpctypes.ErrGRPCNotLeader
	}
	err = m.s.opts.Store.Commit(ctx, append(ops, fence))
	if c, ok := kv.AsConflict(err); ok && c.Index < len(ops) {
		return errMemberChanged
	}
	return err
}

// usedPeerURL reports whether a member other than except has one of urls
// among its peer URLs (etcd's "Peer URLs already exists").
func usedPeerURL(members []*pb.Member, except uint64, urls []string) bool {
	for _, mb := range members {
		if mb.ID == except {
			continue
		}
		for _, u := range mb.PeerURLs {
			if slices.Contains(urls, u) {
				return true
			}
		}
	}
	return false
}

func countLearners(members []*pb.Member) int {
	n := 0
	for _, mb := range members {
		if mb.IsLearner {
			n++
		}
	}
	return n
}

// freshID draws a member ID no member has, as etcd draws one per member add.
func freshID(members []*pb.Member) (uint64, error) {
	for {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("draw a member ID: %w", err)
		}
		id := binary.BigEndian.Uint64(b[:])
		if id != 0 && !slices.ContainsFunc(members, func(mb *pb.Member) bool { return mb.ID == id }) {
			return id, nil
		}
	}
}
