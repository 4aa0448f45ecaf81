// Package etcdapi implements the etcd v3 gRPC services (KV, Watch, Lease,
// Maintenance, Cluster and Auth) on top of the MVCC backend, the watch hub
// and the lessor.
//
// It owns the wire contract: request validation with etcd's exact errors,
// limits, the order of a request's checks, the headers of top-level
// responses (those inside a Txn come from mvcc, which executed it),
// RangeStream's chunking, and the watch stream's IDs and progress requests
// (the hub frames events into responses). It decides which permissions
// each request needs, as etcd does, and asks the auth state (package auth)
// whether the caller holds them; it raises and clears alarms and refuses
// writes over the space quota. In cluster mode it also decides where a
// request is served: here, forwarded to the leader (forward.go), or held
// until the node's next role when it met a node between roles and
// certainly had no effect (reroute.go), and which calls an etcd learner
// serves (learner.go; the server applies the rule). Member changes it
// checks (URLs) and routes to the leader; the server carries them out
// (Membership), as it does Downgrade (Downgrader). Beyond the alarms (a
// meta record, alarm.go) and the quota's size estimate it holds no data,
// and it must not decide semantics that belong to mvcc, watch or auth; it
// translates.
//
// Files: service.go (the services, the node's Role), errors.go (backend
// errors as etcd's gRPC errors), validate.go (limits), kv.go (KV, and the
// one sequence of checks of Put and Txn), rangestream.go, watch.go,
// lease.go, maintenance.go, alarm.go and quota.go (alarms, the space
// quota), cluster.go (members), downgrade.go, auth.go (the Auth service),
// authz.go and authz_admin.go (the permissions each request needs),
// forward.go (leader forwarding), reroute.go (waiting for the next role),
// learner.go.
package etcdapi

import (
	"context"
	"errors"
	"fmt"
	"io"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/internal/mvcc"
)

// toGRPC maps backend errors to the status errors etcd returns, because
// clients (clientv3, kube-apiserver) match on their codes and texts.
func toGRPC(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok && (s.Code() != codes.Unknown || isAnswer(err)) {
		return err
	}
	for _, a := range backendAnswers {
		if errors.Is(err, a.cause) {
			return a.answer(err)
		}
	}
	return status.Error(codes.Internal, fmt.Sprintf("engram: %v", err))
}

// backendAnswers are etcd's answers to the backend's errors, tried in
// order: the first cause err wraps decides.
var backendAnswers = [...]struct {
	cause  error
	answer func(err error) error
}{
	{mvcc.ErrCompacted, always(rpctypes.ErrGRPCCompacted)},
	{mvcc.ErrFutureRev, always(rpctypes.ErrGRPCFutureRev)},
	{mvcc.ErrLeaseNotFound, always(rpctypes.ErrGRPCLeaseNotFound)},
	{mvcc.ErrLeaseExists, always(rpctypes.ErrGRPCLeaseExist)},
	{mvcc.ErrKeyNotFound, always(rpctypes.ErrGRPCKeyNotFound)},
	{mvcc.ErrTooLarge, func(err error) error {
		return status.Error(codes.InvalidArgument, fmt.Sprintf("engram: %v; split it (e.g. delete a large prefix in smaller ranges)", err))
	}},
	{mvcc.ErrNotLeader, always(rpctypes.ErrGRPCLeaderChanged)},
	{mvcc.ErrClosed, always(rpctypes.ErrGRPCStopped)},
	{context.Canceled, always(rpctypes.ErrGRPCCanceled)},
	{context.DeadlineExceeded, always(rpctypes.ErrGRPCDeadlineExceeded)},
	{mvcc.ErrStoreConflict, unavailable},
	{mvcc.ErrUnavailable, unavailable},
}

// always answers every error of its cause with answer.
func always(answer error) func(error) error { return func(error) error { return answer } }

// unavailable answers a write that was not applied and may be retried.
func unavailable(err error) error {
	return status.Error(codes.Unavailable, fmt.Sprintf("engram: %v", err))
}

// isAnswer reports whether err is itself a status error, not one wrapped
// in a Go error: an answer made on purpose (etcd gives some with code
// Unknown, e.g. a password for a certificate-only user), where a status
// wrapped under other errors came from below (an engine's client) and an
// Unknown one there is an internal failure.
func isAnswer(err error) bool {
	_, ok := err.(interface{ GRPCStatus() *status.Status })
	return ok
}

// recvEnd is what a server stream's handler returns when its Recv failed
// with err: nil when the client closed its side or went away, which ends
// the stream without error, and err otherwise.
func recvEnd(err error) error {
	if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
		return nil
	}
	return err
}

func unimplemented(what string) error {
	return status.Error(codes.Unimplemented, "engram: "+what)
}
