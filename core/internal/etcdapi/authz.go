package etcdapi

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/engramkv/engram/core/internal/auth"
)

// This file decides which permissions each request needs, as etcd 3.6
// does (server/etcdserver/apply/apply_auth.go, v3_server.go,
// api/v3rpc/watch.go and maintenance.go); the auth state answers each one.
// With auth off a check costs the Enabled call (one atomic load); with it
// on, the token lookup plus one permission lookup per key range the
// request names (a Txn: every compare and every op of both branches).

// leaseKeysFunc lists the keys attached to a lease; nil where this member
// holds no lessor (a follower), so lease checks are left to the leader.
type leaseKeysFunc func(id int64) [][]byte

// authorize names the caller of ctx and runs need against it. It answers
// nil at once when auth is off. A caller with no identity is checked as the
// empty user, so the auth state answers etcd's "user name is empty".
func (s *Services) authorize(ctx context.Context, need func(auth.Checker, *auth.Info) error) error {
	c := s.auth
	if c == nil || !c.Enabled() {
		return nil
	}
	ai, err := c.Caller(ctx)
	if err != nil {
		return toGRPC(err)
	}
	if ai == nil {
		ai = &auth.Info{}
	}
	return toGRPC(need(c, ai))
}

// authorizeAdmin requires the root role, as etcd's maintenance calls
// (Snapshot, Defragment, Hash, HashKV, MoveLeader, Downgrade, Alarm other
// than GET), Compact and membership changes do.
func (s *Services) authorizeAdmin(ctx context.Context) error {
	return s.authorize(ctx, func(c auth.Checker, ai *auth.Info) error { return c.IsAdminPermitted(ai) })
}

// authorizeCaller requires only that the caller be named by a valid token
// or certificate, as etcd's Status and Alarm GET do.
func (s *Services) authorizeCaller(ctx context.Context) error {
	return s.authorize(ctx, func(_ auth.Checker, ai *auth.Info) error {
		if ai.Username == "" {
			return rpctypes.ErrGRPCUserEmpty
		}
		return nil
	})
}

func needRange(r *pb.RangeRequest) func(auth.Checker, *auth.Info) error {
	return func(c auth.Checker, ai *auth.Info) error { return c.IsRangePermitted(ai, r.Key, r.RangeEnd) }
}

func needDelete(r *pb.DeleteRangeRequest) func(auth.Checker, *auth.Info) error {
	return func(c auth.Checker, ai *auth.Info) error { return checkDelete(c, ai, r) }
}

// permitsPut and permitsTxn are checkPut and checkTxn with the lease keys
// of the role the request runs under (serveWrite), found only once auth
// asks for them.
func permitsPut(c auth.Checker, ai *auth.Info, role *Role, r *pb.PutRequest) error {
	return checkPut(c, ai, role.leaseKeys(), r)
}

func permitsTxn(c auth.Checker, ai *auth.Info, role *Role, r *pb.TxnRequest) error {
	return checkTxn(c, ai, role.leaseKeys(), r)
}

// checkPut: write on the key; a lease already holding keys the caller
// may not write cannot be attached (revoking it would delete them); a
// prev_kv answer reads the key.
func checkPut(c auth.Checker, ai *auth.Info, keys leaseKeysFunc, r *pb.PutRequest) error {
	if err := c.IsPutPermitted(ai, r.Key); err != nil {
		return err
	}
	if err := checkLeaseWrites(c, ai, keys, r.Lease); err != nil {
		return err
	}
	if r.PrevKv {
		return c.IsRangePermitted(ai, r.Key, nil)
	}
	return nil
}

// checkDelete: etcd asks read first when prev_kv is set, then write.
func checkDelete(c auth.Checker, ai *auth.Info, r *pb.DeleteRangeRequest) error {
	if r.PrevKv {
		if err := c.IsRangePermitted(ai, r.Key, r.RangeEnd); err != nil {
			return err
		}
	}
	return c.IsDeleteRangePermitted(ai, r.Key, r.RangeEnd)
}

// checkTxn walks the whole transaction before any of it runs: every
// compare reads its range, and every op of both branches (nested Txns
// included) is checked, whichever branch would run.
func checkTxn(c auth.Checker, ai *auth.Info, keys leaseKeysFunc, r *pb.TxnRequest) error {
	for _, cmp := range r.Compare {
		if err := c.IsRangePermitted(ai, cmp.Key, cmp.RangeEnd); err != nil {
			return err
		}
	}
	if err := checkOps(c, ai, keys, r.Success); err != nil {
		return err
	}
	return checkOps(c, ai, keys, r.Failure)
}

func checkOps(c auth.Checker, ai *auth.Info, keys leaseKeysFunc, ops []*pb.RequestOp) error {
	for _, op := range ops {
		var err error
		switch {
		case op.GetRequestRange() != nil:
			rr := op.GetRequestRange()
			err = c.IsRangePermitted(ai, rr.Key, rr.RangeEnd)
		case op.GetRequestPut() != nil:
			err = checkPut(c, ai, keys, op.GetRequestPut())
		case op.GetRequestDeleteRange() != nil:
			err = checkDelete(c, ai, op.GetRequestDeleteRange())
		case op.GetRequestTxn() != nil:
			err = checkTxn(c, ai, keys, op.GetRequestTxn())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// checkLeaseWrites: root may do anything with a lease; anyone else must be
// allowed to write every key attached to it (etcd's rule for attaching a
// put to a lease and for revoking it).
func checkLeaseWrites(c auth.Checker, ai *auth.Info, keys leaseKeysFunc, id int64) error {
	if id == 0 || keys == nil {
		return nil
	}
	if c.IsAdminPermitted(ai) == nil {
		return nil
	}
	for _, k := range keys(id) {
		if err := c.IsPutPermitted(ai, k); err != nil {
			return err
		}
	}
	return nil
}

// checkLeaseReads: LeaseTimeToLive (and LeaseLeases, over every lease)
// need read on every attached key unless the caller is root. Like etcd,
// a caller named by nothing is refused even for a lease with no keys.
func checkLeaseReads(c auth.Checker, ai *auth.Info, keys leaseKeysFunc, ids ...int64) error {
	if ai.Username == "" {
		return rpctypes.ErrGRPCUserEmpty
	}
	if c.IsAdminPermitted(ai) == nil || keys == nil {
		return nil
	}
	for _, id := range ids {
		for _, k := range keys(id) {
			if err := c.IsRangePermitted(ai, k, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// needLeaseRevoke: as checkLeaseWrites, but etcd refuses an unnamed caller
// first.
func needLeaseRevoke(id int64, keys leaseKeysFunc) func(auth.Checker, *auth.Info) error {
	return func(c auth.Checker, ai *auth.Info) error {
		if ai.Username == "" {
			return rpctypes.ErrGRPCUserEmpty
		}
		return checkLeaseWrites(c, ai, keys, id)
	}
}

func needLeaseReads(keys leaseKeysFunc, ids ...int64) func(auth.Checker, *auth.Info) error {
	return func(c auth.Checker, ai *auth.Info) error { return checkLeaseReads(c, ai, keys, ids...) }
}

// watchRefusal is the cancel reason etcd gives a watch create it refuses
// for auth: the full text of its gRPC error, status prefix included.
func (s *Services) watchRefusal(ctx context.Context, cr *pb.WatchCreateRequest) string {
	err := s.authorize(ctx, func(c auth.Checker, ai *auth.Info) error { return c.IsRangePermitted(ai, cr.Key, cr.RangeEnd) })
	if err == nil {
		return ""
	}
	return err.Error()
}

// leaseKeys lists attached keys from this member's lessor, or nil on a
// follower (the leader checks the lease again when the write reaches it).
func (r *Role) leaseKeys() leaseKeysFunc {
	if r.Lessor == nil {
		return nil
	}
	return r.Lessor.Keys
}

// leaseIDs lists this member's leases, or none on a follower.
func (r *Role) leaseIDs() []int64 {
	if r.Lessor == nil {
		return nil
	}
	return r.Lessor.List()
}

// needLeaseList: LeaseLeases reads every key of every lease; the list is
// taken only once auth is known to be on.
func needLeaseList(r *Role) func(auth.Checker, *auth.Info) error {
	return func(c auth.Checker, ai *auth.Info) error {
		return checkLeaseReads(c, ai, r.leaseKeys(), r.leaseIDs()...)
	}
}
