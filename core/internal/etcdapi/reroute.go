package etcdapi

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/internal/mvcc"
)

// During a failover a request can meet a node between roles: a follower
// that has not learned the new leader yet, a leader whose lease has just
// lapsed, a forward to a leader that has just died. Answering at once
// ("no leader", "leader changed") hands the failover to the client, and
// clientv3 does not retry a write on either answer: kube-apiserver turns
// them into errors its own clients see. So a request that was certainly
// not served waits for the node's next role, bounded by its own deadline
// and by Options.LeaderWait, and runs again under that role. DESIGN.md,
// "Failover that clients do not see", has the measurements.
//
// Only a request that had no effect may run again. Two answers say so:
//
//   - mvcc.ErrNotLeader from the backend: the write was refused before it
//     was committed (its invariant, stated in mvcc), or a read's fence
//     failed;
//   - a forward that never reached the leader: gRPC found no connection to
//     send it on (no peer was recorded for the call). A forward that was
//     sent and then lost its connection may have been applied by the old
//     leader and is answered "leader changed" as before (forwardErr).

// notServed wraps the answer to a request that had no effect, so
// serveWithRole may run it again under the next role.
type notServed struct{ answer error }

func (e *notServed) Error() string { return e.answer.Error() }
func (e *notServed) Unwrap() error { return e.answer }

// GRPCStatus answers the client with the wrapped answer wherever a
// notServed escapes serveWithRole (a handler that answers at once).
func (e *notServed) GRPCStatus() *status.Status { return status.Convert(e.answer) }

// fromBackend is toGRPC for a backend error, marking those that left the
// request without effect because this node does not lead.
func fromBackend(err error) error {
	if errors.Is(err, mvcc.ErrNotLeader) {
		return &notServed{toGRPC(err)}
	}
	return toGRPC(err)
}

// serveWithRole runs serve under the node's current role and, while serve
// reports the request not served, again under each next role, until it is
// served, the request's context ends, the services drain (unless the next
// role is already there) or LeaderWait passes; then the last answer stands. With needLeader it waits, without
// running serve, while the role neither leads nor knows a leader (a
// follower between leaders), since serve would only forward to nobody.
func serveWithRole[Resp any](ctx context.Context, s *Services, needLeader bool, serve func(*Role) (Resp, error)) (Resp, error) {
	var timeout <-chan time.Time
	for {
		role := s.current()
		var resp Resp
		var err error
		if needLeader && !role.leading() && role.Leader == nil {
			err = &notServed{noLeader}
		} else {
			resp, err = serve(role)
		}
		var ns *notServed
		if !errors.As(err, &ns) {
			return resp, err
		}
		if s.leaderWait <= 0 {
			return resp, ns.answer
		}
		if timeout == nil {
			// Only a request that must wait pays for the timer.
			t := time.NewTimer(s.leaderWait)
			defer t.Stop()
			timeout = t.C
		}
		if s.onLeaderWait != nil {
			s.onLeaderWait()
		}
		select {
		case <-role.ended:
		case <-ctx.Done():
			return resp, ns.answer
		case <-timeout:
			return resp, ns.answer
		case <-s.draining:
			// A node stopped right after it handed leadership off drains
			// while its held calls wake for the role it now knows; select
			// picks either when both are ready, and those calls must run
			// under that role, not end "leader changed". Draining stops
			// only the waits for a role not yet known.
			select {
			case <-role.ended:
				continue
			default:
			}
			return resp, ns.answer
		}
	}
}
