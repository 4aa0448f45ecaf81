package server

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/engramkv/engram/core/internal/election"
	"github.com/engramkv/engram/core/internal/etcdapi"
	"github.com/engramkv/engram/core/internal/mvcc"
)

// A clustered node starts as a follower: it serves reads from a read-only
// view of the shared store and forwards everything else to the leader the
// election names. When it is elected it recovers the leader's state from
// the store (revision, compacted revision, leases) and serves everything;
// the watch history a new leader serves comes from the durable change log,
// so clients that re-watch from their last revision lose no event
// (DESIGN.md, "Cluster roles and forwarding").

func (s *Server) startCluster(ctx, runCtx context.Context, apiOpts *etcdapi.Options) error {
	opts := s.opts
	if len(opts.AdvertiseClientURLs) == 0 {
		return fmt.Errorf("server: a cluster member needs an advertised client URL for followers to forward to")
	}
	reader, err := mvcc.Open(ctx, mvcc.Options{Store: opts.Store, Logger: s.log.With("component", "mvcc-reader"), ReadOnly: true, TempDir: opts.TempDir})
	if err != nil {
		return fmt.Errorf("server: open read-only view: %w", err)
	}
	s.reader = reader
	if err := s.register(ctx); err != nil {
		return err
	}
	apiOpts.Role = &etcdapi.Role{Backend: reader}
	// A request that meets no leader waits for one (etcdapi's reroute.go)
	// as long as a takeover can take: the dead leader's lease running
	// out, then the successor's recovery, bounded by a second lease.
	lease := opts.Cluster.LeaseDuration
	if lease <= 0 {
		lease = election.DefaultLeaseDuration
	}
	s.leaderWait = 2 * lease
	apiOpts.LeaderWait = s.leaderWait
	apiOpts.OnLeaderWait = s.rpc.leaderWaits.Inc
	apiOpts.Members = s.members
	apiOpts.Membership = membership{s}
	apiOpts.MemberID = s.selfID
	apiOpts.IsLearner = s.learner.Load
	s.api = etcdapi.New(*apiOpts)
	electionClock := opts.Cluster.Clock
	if electionClock == nil {
		electionClock = opts.Clock
	}
	s.elector, err = election.New(election.Options{
		Store:         opts.Store,
		ID:            opts.Name,
		URL:           s.currentPeerURL(),
		Candidate:     s.mayCampaign,
		LeaseDuration: opts.Cluster.LeaseDuration,
		RenewInterval: opts.Cluster.RenewInterval,
		Logger:        s.log.With("component", "election"),
		Clock:         electionClock,
	})
	if err != nil {
		return err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.elector.Run(runCtx, election.Callbacks{
			Elected:       s.becomeLeader,
			SteppedDown:   s.becomeFollower,
			LeaderChanged: s.followLeader,
		})
	}()
	return nil
}

func (s *Server) becomeLeader(ctx context.Context, term int64) error {
	start := time.Now()
	ls, err := s.startLeader(ctx, s.elector.Fence, s.opts.Registerer)
	if err != nil {
		s.log.Error("elected, but recovering the leader state failed", "term", term, "err", err)
		return err
	}
	if old := s.swapLeader(ls); old != nil {
		old.stop()
	}
	s.api.SetRole(ls.role(s.selfID))
	s.publishRole(publishedRole{leading: true, leader: s.opts.Name})
	s.log.Info("serving as leader", "term", term, "revision", ls.backend.Rev(), "recovery", time.Since(start))
	// The others find this leader now rather than at their next round
	// (wake.go); their requests wait for it meanwhile.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		wctx, cancel := context.WithTimeout(ctx, s.leaderWait)
		defer cancel()
		s.wakePeers(wctx)
	}()
	return nil
}

// swapLeader makes ls the leader state this node serves with (nil: none)
// and returns the one it replaces, for the caller to stop.
func (s *Server) swapLeader(ls *leaderState) *leaderState {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.leader
	s.leader = ls
	return old
}

func (s *Server) becomeFollower() {
	ls := s.swapLeader(nil)
	// New requests go the follower way first; then the old leader state
	// finishes what it had (its queued writes fail their fence).
	s.api.SetRole(&etcdapi.Role{Backend: s.reader})
	if ls != nil {
		ls.stop()
	}
	// The LeaderChanged that follows names the next leader, if any.
	s.publishRole(publishedRole{})
}

func (s *Server) followLeader(r election.Record, ok bool) {
	if ok && r.Holder == s.opts.Name {
		return // becomeLeader sets the role
	}
	var link *leaderLink
	var leaderID uint64
	if ok {
		// The leader's ID is in its member record; this runs in the
		// election loop, so the read is bounded by half a lease.
		ctx, cancel := context.WithTimeout(context.Background(), s.leaderWait/4)
		leaderID = s.idOf(ctx, r.Holder)
		cancel()
		var err error
		if link, err = s.dialLeader(r.URL); err != nil {
			s.log.Error("cannot reach the leader", "leader", r.Holder, "url", r.URL, "err", err)
		}
	}
	s.mu.Lock()
	old := s.conn
	s.conn = link
	leading := s.leader != nil
	s.mu.Unlock()
	if !leading {
		role := &etcdapi.Role{Backend: s.reader}
		if link != nil {
			role.Leader, role.LeaderID = link.conn, leaderID
		}
		s.api.SetRole(role)
		s.log.Info("following", "leader", r.Holder, "term", r.Term, "known", ok)
		following := publishedRole{}
		if link != nil {
			following.leader = r.Holder
		}
		s.publishRole(following)
	}
	if old != nil {
		// The calls in flight on the old link get the old leader's answer
		// if it is alive; one that is gone fails them, after the bound,
		// with "leader changed".
		old.closeWhenIdle(s.leaderWait)
	}
}

// dial connects to a member's advertised URL (http://, https:// or unix://).
func (s *Server) dial(raw string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("parse leader URL %q: %w", raw, err)
	}
	creds := insecure.NewCredentials()
	target := u.Host
	switch u.Scheme {
	case "https":
		if s.opts.Cluster.ClientTLS == nil {
			return nil, fmt.Errorf("leader URL %q needs TLS, but no client TLS is configured", raw)
		}
		creds = credentials.NewTLS(s.opts.Cluster.ClientTLS)
	case "unix", "unixs":
		target = "unix://" + u.Path
		if u.Path == "" {
			target = "unix://" + u.Host
		}
	case "http", "":
	default:
		return nil, fmt.Errorf("leader URL %q: unsupported scheme", raw)
	}
	opts := append(s.forwardCallerOptions(), grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<31-1)))
	opts = append(opts, extra...)
	return grpc.NewClient(target, opts...)
}

// hasLeader reports whether requests can be served now: always without a
// cluster, and while a leader is known in one.
func (s *Server) hasLeader() bool {
	if s.elector == nil {
		return true
	}
	_, ok := s.elector.Leader()
	return ok
}

// checkLeader answers etcd's "no leader" to requests that carry the
// hasleader metadata (clientv3.WithRequireLeader) while there is none.
func (s *Server) checkLeader(ctx context.Context) error {
	// The metadata is only consulted without a leader: reading it copies
	// every header of the call, a cost no request should pay for nothing.
	if s.hasLeader() {
		return nil
	}
	if v := metadata.ValueFromIncomingContext(ctx, rpctypes.MetadataRequireLeaderKey); len(v) > 0 && v[0] == rpctypes.MetadataHasLeader {
		return rpctypes.ErrGRPCNoLeader
	}
	return nil
}
