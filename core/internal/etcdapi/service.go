package etcdapi

import (
	"cmp"
	"context"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/engramkv/engram/core/internal/auth"
	"github.com/engramkv/engram/core/internal/lease"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/watch"
	"github.com/engramkv/engram/core/kv"
)

// Role is what this node does at the moment. The leader has a writable
// backend, a watch hub and a lessor; a follower has a read-only backend and,
// when a leader is known, a connection to it for everything else.
type Role struct {
	// Backend serves reads on every node and writes on the leader.
	Backend *mvcc.Backend
	// Hub and Lessor are set on the leader only.
	Hub    *watch.Hub
	Lessor *lease.Lessor
	// Leader is set on a follower that knows the leader.
	Leader *grpc.ClientConn
	// LeaderID is the member ID of the leader (0 when unknown).
	LeaderID uint64

	// ended is closed when the role is replaced: streams bound to it (local
	// watches of a leader that stepped down, forwarded ones to a leader that
	// changed) end with "leader changed" and clients resume elsewhere.
	ended chan struct{}
}

func (r *Role) leading() bool { return r.Hub != nil }

// Options configure the services.
type Options struct {
	// Role is the initial role; SetRole changes it.
	Role   *Role
	Store  kv.Store
	Limits Limits
	Logger *slog.Logger
	// Name is this member's name; its hash is the cluster ID, and the
	// member ID unless MemberID is set.
	Name string
	// MemberID is this member's ID when it is not its name's hash (a
	// member that claimed the record of an etcdctl member add).
	MemberID   uint64
	ClientURLs []string
	// Version is reported by Status; it must be >= 3.5.13 for
	// kube-apiserver to enable RequestWatchProgress.
	Version string
	// Release is Engram's own release, sent with every Status answer in
	// the ReleaseHeader header so that members can ask each other which
	// release they run (0.9.0 sends none).
	Release string
	// Members lists the cluster's members for MemberList; nil reports
	// this node alone.
	Members func(context.Context) ([]*pb.Member, error)
	// Membership carries out MoveLeader and the member changes in cluster
	// mode; nil answers as a one-member etcd does.
	Membership Membership
	// IsLearner reports whether this member is a learner now (Status's
	// IsLearner); nil: never.
	IsLearner func() bool
	// Downgrader answers Downgrade and Status's downgrade field; nil
	// answers Downgrade Unimplemented.
	Downgrader Downgrader
	// Auth answers who calls and what they may do; nil means auth can
	// never be on (tests of other concerns).
	Auth auth.Checker
	// QuotaBackendBytes raises NOSPACE and refuses writes that add data
	// once the store (a kv.Sizer) would hold this many bytes; 0: no quota.
	QuotaBackendBytes int64
	// LeaderWait bounds how long a request that needs the leader waits
	// for one to be known, or for the next role after this node stopped
	// leading, before it is answered "no leader" or "leader changed"
	// (reroute.go); 0 answers at once.
	LeaderWait time.Duration
	// OnLeaderWait, if set, is called each time a request starts such a
	// wait (a metric; tests wait on it).
	OnLeaderWait func()
}

// Services implements the etcd v3 gRPC services.
type Services struct {
	role         atomic.Pointer[Role]
	store        kv.Store
	limits       Limits
	log          *slog.Logger
	name         string
	urls         []string
	version      string
	clusterID    uint64
	release      string
	memberID     uint64
	isLearner    func() bool
	members      func(context.Context) ([]*pb.Member, error)
	auth         auth.Checker
	quota        *quota // nil: no quota
	leaderWait   time.Duration
	onLeaderWait func()
	alarms       alarms
	// draining is closed by Drain: long-lived streams end so a graceful
	// gRPC stop does not wait on them.
	draining  chan struct{}
	drainOnce sync.Once

	membership Membership // see Options.Membership
	downgrader Downgrader // see Options.Downgrader
}

// New returns the services.
func New(opts Options) *Services {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Name == "" {
		opts.Name = "default"
	}
	s := &Services{
		store:     opts.Store,
		limits:    opts.Limits.withDefaults(),
		log:       opts.Logger,
		name:      opts.Name,
		urls:      opts.ClientURLs,
		version:   opts.Version,
		release:   opts.Release,
		clusterID: MemberID(opts.Name),
		memberID:  cmp.Or(opts.MemberID, MemberID(opts.Name)),
		isLearner: opts.IsLearner,
		members:   opts.Members,
		auth:      opts.Auth,
		draining:  make(chan struct{}),

		leaderWait:   opts.LeaderWait,
		onLeaderWait: opts.OnLeaderWait,
	}
	s.membership = opts.Membership
	s.downgrader = opts.Downgrader
	s.quota = newQuota(opts.QuotaBackendBytes, opts.Store, opts.Logger)
	opts.Role.ended = make(chan struct{})
	s.role.Store(opts.Role)
	return s
}

// MemberID derives a member's etcd ID from its name.
func MemberID(name string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return h.Sum64() | 1
}

// Drain ends the watch and lease keepalive streams with etcd's "server
// stopped" (clients move to another member) and refuses new ones. Call it
// before stopping the gRPC server gracefully.
func (s *Services) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

// SetRole switches the services to a new role; requests already running
// finish on the old one.
func (s *Services) SetRole(r *Role) {
	r.ended = make(chan struct{})
	if old := s.role.Swap(r); old != nil && old != r {
		close(old.ended)
	}
}

// current returns the role now in force.
func (s *Services) current() *Role { return s.role.Load() }

// Register registers every service on gs.
func (s *Services) Register(gs *grpc.Server) {
	pb.RegisterKVServer(gs, &kvServer{s: s})
	pb.RegisterWatchServer(gs, &watchServer{s: s})
	pb.RegisterLeaseServer(gs, &leaseServer{s: s})
	pb.RegisterMaintenanceServer(gs, &maintenanceServer{s: s})
	pb.RegisterClusterServer(gs, &clusterServer{s: s})
	pb.RegisterAuthServer(gs, &authServer{s: s})
}

func (s *Services) header(rev int64) *pb.ResponseHeader {
	return &pb.ResponseHeader{ClusterId: s.clusterID, MemberId: s.memberID, Revision: rev, RaftTerm: 1}
}

// fillHeader completes a top-level response's header: the revision the
// backend set (rev if it set none) and this member's IDs. It fills the
// backend's header in place rather than allocating another per request,
// which relies on every response of the backend having a header of its
// own (mvcc makes one per response).
func (s *Services) fillHeader(h **pb.ResponseHeader, rev int64) {
	if *h == nil {
		*h = s.header(rev)
		return
	}
	hd := *h
	if hd.Revision == 0 {
		hd.Revision = rev
	}
	hd.ClusterId, hd.MemberId, hd.RaftTerm = s.clusterID, s.memberID, 1
}
