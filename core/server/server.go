// Package server assembles Engram's core (MVCC backend, watch hub, lessor,
// compaction policy) over one kv.Store and exposes it as the etcd v3 gRPC
// services.
//
// It owns the lifecycle of those parts: recovery on start, background loops,
// graceful shutdown that acknowledges no write it has not made durable; and
// in cluster mode the node's roles as the election decides them, its link
// to the leader (leaderlink.go), the wake-ups that tell the other
// members to look at the lease record now (wake.go), the member records
// (members.go) with the changes etcdctl's member commands make on the
// leader, a learner's limits (learner.go), and the members' published
// versions, from which it decides the cluster version that gates new
// formats and answers Downgrade (clusterversion.go, downgrade.go). It also
// owns the gRPC interceptors around the services and the Prometheus
// metrics they and the core's parts feed: Engram's own series (metrics.go)
// and etcd's, with etcd's names, so dashboards made for etcd work. It does
// not open storage engines, parse configuration or listen on sockets; the
// binary in cmd/engram and the test harnesses do that and hand it a kv.Store.
//
// Its gRPC interceptors (metrics.go) run the learner, leader and admin
// checks and count every call by method, under Engram's names and etcd's
// grpc_server_* (grpc_metrics.go); what etcd would count of a request
// beyond its method is not decided here but in core/internal/etcdmetrics,
// which the interceptors hand each request and answer to.
//
// It is the core's public entry point for embedders: cmd/engram is one such
// embedder, and everything it uses from the core's internals is reached
// through this package's Options and methods.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/version"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/engramkv/engram/core/internal/auth"
	"github.com/engramkv/engram/core/internal/clock"
	"github.com/engramkv/engram/core/internal/compaction"
	"github.com/engramkv/engram/core/internal/election"
	"github.com/engramkv/engram/core/internal/etcdapi"
	"github.com/engramkv/engram/core/internal/etcdmetrics"
	"github.com/engramkv/engram/core/internal/lease"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/watch"
	"github.com/engramkv/engram/core/kv"
	release "github.com/engramkv/engram/core/version"
)

// Options configures a Server. The zero value of every field but Store is a
// sensible default.
type Options struct {
	// Store is the storage adaptor. The Server does not close it.
	Store kv.Store
	// Logger receives structured logs; nil uses slog.Default().
	Logger *slog.Logger
	// Registerer receives the server's Prometheus metrics; nil registers none.
	Registerer prometheus.Registerer
	// Clock times lease expiry, watch progress notifications, the
	// compaction policy and the election (unless Cluster.Clock is set);
	// nil means the system clock.
	// Tests inside core inject a fake one (core/internal/clock/fakeclock)
	// so that they advance time instead of waiting for it.
	Clock clock.Clock

	// ProgressNotifyInterval is how often a watch created with
	// progress_notify and no recent events gets a progress response
	// (etcd: --experimental-watch-progress-notify-interval, default 10m).
	ProgressNotifyInterval time.Duration
	// WatchMaxLag is how many revisions a watcher may fall behind the head
	// before it is cancelled with a reason; 0 uses the default, negative
	// disables the limit.
	WatchMaxLag int64
	// LatestCacheBytes bounds the leader's cache of latest records (see
	// mvcc.Options.LatestCacheBytes).
	LatestCacheBytes int64
	// WriteGroupRequests and PipelineDepth bound the writer's groups and
	// how many of them may be committing or waiting to (see
	// mvcc.Options.MaxGroupRequests and PipelineDepth); 0 keeps the
	// defaults. Tests lower them to stack several groups in the pipeline.
	WriteGroupRequests int
	PipelineDepth      int
	// TempDir holds the temporary files of snapshots and HashKV (sorted
	// runs, the snapshot being streamed); "" means os.TempDir().
	TempDir string

	// Compaction is the optional server-side compaction policy. The default
	// is off: kube-apiserver compacts by itself.
	Compaction CompactionPolicy

	// MaxRequestBytes bounds one request (etcd default 1.5 MiB).
	MaxRequestBytes int
	// MaxTxnOps bounds the operations in one Txn (etcd default 128).
	MaxTxnOps int

	// Name is this member's name in MemberList and Status. In a cluster it
	// must be unique and stable: it is the node's identity in the election.
	Name string
	// AdvertiseClientURLs are reported in MemberList; in a cluster the first
	// one is where the other members reach this node (followers forward
	// there while it leads) unless its member record names peer URLs
	// (etcdctl member add or update; members.go).
	AdvertiseClientURLs []string

	// Cluster runs several nodes over one shared store.
	Cluster ClusterOptions

	// Auth says how authentication tokens are made; users, roles and
	// whether auth is on live in the store.
	Auth AuthOptions

	// QuotaBackendBytes raises the NOSPACE alarm once the store reports
	// more bytes than this (kv.Sizer); 0 sets no quota.
	QuotaBackendBytes int64
}

// AuthOptions configure the tokens of etcd's authentication.
type AuthOptions struct {
	// Token is etcd's --auth-token value: "simple" (or "") or
	// "jwt,pub-key=FILE,priv-key=FILE,sign-method=ALG[,ttl=DURATION]".
	Token string
	// TokenTTL is a simple token's lifetime after its last use; 0 means
	// etcd's 300s.
	TokenTTL time.Duration
	// BcryptCost hashes passwords; 0 means etcd's 10.
	BcryptCost int
}

// ClusterOptions configure leader election among nodes sharing a store.
type ClusterOptions struct {
	// Enabled runs the election. Without it the node is always leader,
	// which is right when nothing else can open the store (badger).
	Enabled bool
	// LeaseDuration bounds how long a failed leader keeps the lease: a new
	// leader serves within about this time.
	LeaseDuration time.Duration
	// RenewInterval is how often the leader renews (at most half the lease).
	RenewInterval time.Duration
	// ClientTLS, if set, is used to forward requests to the leader.
	ClientTLS *tls.Config
	// Clock, if set, times the election instead of Options.Clock. The
	// cluster tests give each member's election its own view of the fake
	// clock the rest of the member runs on (fakeclock.Loop), so that
	// advancing it returns once every election has run its round.
	Clock clock.Clock
}

// CompactionPolicy is the server-side compaction schedule (package
// compaction); the zero value is off.
type CompactionPolicy = compaction.Policy

// Defaults.
const (
	DefaultProgressNotifyInterval = 10 * time.Minute
	DefaultWatchMaxLag            = 1 << 20
	grpcOverheadBytes             = 512 * 1024
)

// Server is a running Engram core.
type Server struct {
	opts    Options
	log     *slog.Logger
	api     *etcdapi.Services
	rpc     *rpcMetrics
	methods *methodTable // the per-method series the interceptors move
	watchM  *watch.Metrics
	etcdM   *etcdmetrics.Metrics
	leaseM  *leaseMetrics
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	ready   atomic.Bool
	closed  atomic.Bool
	elector *election.Elector // nil unless clustered
	reader  *mvcc.Backend     // a follower's read-only view; nil unless clustered
	auth    *auth.Store       // signs the callers a follower forwards (auth.go)
	// leaderWait bounds a request's wait for a leader (etcdapi's
	// LeaderWait) and the wait for calls on a replaced leader link.
	leaderWait time.Duration

	// In a cluster, this member's ID, and whether it is a learner now
	// (members.go).
	selfID  uint64
	learner atomic.Bool
	// memberMu serializes the member changes this node makes as leader,
	// so that each checks the members as the one before left them.
	memberMu sync.Mutex

	mu     sync.Mutex
	leader *leaderState // non-nil while this node leads
	conn   *leaderLink  // to the leader, while following
	// peerURL is where the other members reach this node (members.go);
	// nil until it registered.
	peerURL atomic.Pointer[string]

	// roleMu guards the role as published once in effect (see RoleChanged).
	roleMu      sync.Mutex
	role        publishedRole
	roleChanged chan struct{} // closed and replaced at each change
}

// publishedRole is what IsLeader and Leader report.
type publishedRole struct {
	leading bool
	leader  string // the known leader's name; "" while none is known
}

// leaderState is what exists only while this node leads.
type leaderState struct {
	backend *mvcc.Backend
	hub     *watch.Hub
	lessor  *lease.Lessor
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// ErrNotReady is returned by Ready until recovery has finished or after Close.
var ErrNotReady = errors.New("server: not ready")

// New recovers the state held in opts.Store and starts the background loops
// (lease expiry, compaction policy).
func New(ctx context.Context, opts Options) (*Server, error) {
	if opts.Store == nil {
		return nil, errors.New("server: no store")
	}
	if err := opts.Compaction.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real
	}
	if opts.ProgressNotifyInterval <= 0 {
		opts.ProgressNotifyInterval = DefaultProgressNotifyInterval
	}
	switch {
	case opts.WatchMaxLag == 0:
		opts.WatchMaxLag = DefaultWatchMaxLag
	case opts.WatchMaxLag < 0:
		opts.WatchMaxLag = 0
	}
	if opts.Name == "" {
		opts.Name = "default"
	}
	log := opts.Logger
	runCtx, cancel := context.WithCancel(context.Background())
	s := &Server{opts: opts, log: log, cancel: cancel, rpc: newRPCMetrics(opts.Registerer), watchM: watch.NewMetrics(opts.Registerer), roleChanged: make(chan struct{})}
	etcdM, grpcM := newEtcdMetrics(s, opts.Registerer)
	s.etcdM = etcdM
	s.leaseM = newLeaseMetrics(s, opts.Registerer, etcdM)
	s.methods = &methodTable{grpc: grpcM, rpc: s.rpc, admin: etcdapi.IsAdminMethod}
	apiOpts := etcdapi.Options{
		Store:      opts.Store,
		Limits:     etcdapi.Limits{MaxRequestBytes: opts.MaxRequestBytes, MaxTxnOps: opts.MaxTxnOps},
		Logger:     log.With("component", "api"),
		Name:       opts.Name,
		ClientURLs: opts.AdvertiseClientURLs,
		Version:    version.Version,
		Release:    release.Release,

		QuotaBackendBytes: opts.QuotaBackendBytes,
		Downgrader:        downgrader{s},
	}
	authState, err := s.openAuth(ctx, runCtx)
	if err != nil {
		cancel()
		return nil, err
	}
	apiOpts.Auth = authState
	if !opts.Cluster.Enabled {
		ls, err := s.startLeader(runCtx, nil, opts.Registerer)
		if err != nil {
			cancel()
			return nil, err
		}
		s.leader = ls
		apiOpts.Role = ls.role(etcdapi.MemberID(opts.Name))
		s.api = etcdapi.New(apiOpts)
		s.publishRole(publishedRole{leading: true, leader: opts.Name})
		s.ready.Store(true)
		return s, nil
	}
	if err := s.startCluster(ctx, runCtx, &apiOpts); err != nil {
		cancel()
		return nil, err
	}
	s.ready.Store(true)
	return s, nil
}

// startLeader recovers the state from the store and starts what only the
// leader runs: the writer (fenced when fence is set), the watch hub, the
// lease expiry loop and the compaction policy. They stop when ctx ends or
// stopLeader is called.
func (s *Server) startLeader(ctx context.Context, fence func() (kv.Op, error), reg prometheus.Registerer) (*leaderState, error) {
	log := s.log
	lessor := lease.New(lease.Options{Clock: s.opts.Clock})
	backend, err := mvcc.Open(ctx, mvcc.Options{Store: s.etcdM.TimedStore(s.opts.Store), Lessor: lessor, Logger: log.With("component", "mvcc"), Registerer: reg, Fence: fence, LatestCacheBytes: s.opts.LatestCacheBytes, TempDir: s.opts.TempDir,
		MaxGroupRequests: s.opts.WriteGroupRequests, PipelineDepth: s.opts.PipelineDepth})
	if err != nil {
		return nil, fmt.Errorf("server: recover state: %w", err)
	}
	hub := watch.NewHub(backend, watch.Options{
		ProgressInterval: s.opts.ProgressNotifyInterval,
		Clock:            s.opts.Clock,
		MaxLag:           s.opts.WatchMaxLag,
		IsCompacted:      func(err error) bool { return errors.Is(err, mvcc.ErrCompacted) },
		Logger:           log.With("component", "watch"),
		Metrics:          s.watchM,
	})
	backend.SetNotifier(hub)
	lctx, cancel := context.WithCancel(ctx)
	ls := &leaderState{backend: backend, hub: hub, lessor: lessor, cancel: cancel}
	ls.wg.Add(1)
	go func() {
		defer ls.wg.Done()
		lessor.Run(lctx, log.With("component", "lease"), func(ctx context.Context, id int64) error {
			_, err := backend.RevokeLease(ctx, id)
			if errors.Is(err, mvcc.ErrLeaseNotFound) {
				return nil
			}
			if err == nil {
				s.leaseM.leaseExpired()
			}
			return err
		}, time.Second)
	}()
	if s.opts.Compaction.Mode != compaction.Off {
		ls.wg.Add(1)
		go func() {
			defer ls.wg.Done()
			s.opts.Compaction.Run(lctx, s.opts.Clock, backend, func(err error) bool { return errors.Is(err, mvcc.ErrCompacted) }, log.With("component", "compaction"))
		}()
	}
	return ls, nil
}

func (ls *leaderState) role(id uint64) *etcdapi.Role {
	return &etcdapi.Role{Backend: ls.backend, Hub: ls.hub, Lessor: ls.lessor, LeaderID: id}
}

// stop ends the leader's loops, answers the writes already queued (a
// deposed leader's fail their fence), and ends its watchers.
func (ls *leaderState) stop() {
	ls.cancel()
	ls.wg.Wait()
	ls.hub.Close()
	_ = ls.backend.Close()
}

// Register registers the etcd services on gs, and in cluster mode the
// members' election wake-up (wake.go).
func (s *Server) Register(gs *grpc.Server) {
	s.api.Register(gs)
	if s.elector != nil {
		gs.RegisterService(&wakeService, s)
	}
	s.methods.register(gs)
}

// Ready returns nil while the server is serving.
func (s *Server) Ready() error {
	if !s.ready.Load() || s.closed.Load() {
		return ErrNotReady
	}
	return nil
}

// IsLeader reports whether this node serves as leader (always true without
// a cluster).
func (s *Server) IsLeader() bool {
	s.roleMu.Lock()
	defer s.roleMu.Unlock()
	return s.role.leading
}

// Leader returns the name of the member this node serves as leader or
// forwards to; ok is false while it knows no leader.
func (s *Server) Leader() (name string, ok bool) {
	s.roleMu.Lock()
	defer s.roleMu.Unlock()
	return s.role.leader, s.role.leader != ""
}

// RoleChanged returns a channel closed at this node's next change of role,
// once the new role is in effect: when it takes up or gives up leadership,
// or starts forwarding to another leader or to none. Take the channel
// before reading IsLeader or Leader, so that no change falls in between;
// this lets a caller wait for a role instead of polling for it.
func (s *Server) RoleChanged() <-chan struct{} {
	s.roleMu.Lock()
	defer s.roleMu.Unlock()
	return s.roleChanged
}

// publishRole records the role now in effect and wakes RoleChanged's
// waiters.
func (s *Server) publishRole(r publishedRole) {
	s.roleMu.Lock()
	defer s.roleMu.Unlock()
	s.role = r
	s.etcdM.LeaderSeen(r.leader)
	close(s.roleChanged)
	s.roleChanged = make(chan struct{})
}

// Drain ends long-lived streams (watches, lease keepalives) with etcd's
// "server stopped", so clients move to another member and a graceful gRPC
// stop does not wait for them. Call it first when shutting down.
func (s *Server) Drain() { s.api.Drain() }

// Close stops the server: queued writes are committed and acknowledged,
// watchers end, background loops stop. It does not close the store. Call it
// after the gRPC server stopped accepting requests.
func (s *Server) Close(ctx context.Context) error {
	if s.closed.Swap(true) {
		return nil
	}
	s.api.Drain()
	s.cancel()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		s.mu.Lock()
		ls := s.leader
		s.leader = nil
		conn := s.conn
		s.conn = nil
		s.mu.Unlock()
		if ls != nil {
			ls.stop()
		}
		if conn != nil {
			_ = conn.conn.Close()
		}
		if s.reader != nil {
			_ = s.reader.Close()
		}
		s.publishRole(publishedRole{})
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("server: close: %w", ctx.Err())
	}
}

// streamWorkers sizes the gRPC worker pool for a few hundred concurrent
// calls, kube-apiserver's usual in-flight load; idle workers cost only
// their stacks (tens of KiB each).
const streamWorkers = 256

// GRPCServerOptions returns the grpc.ServerOptions an etcd-compatible server
// needs: message size limits as etcd's, keepalive enforcement that accepts
// kube-apiserver's 30 s client pings, and TLS credentials when tlsConfig is
// non-nil. Callers add their own options after these.
func GRPCServerOptions(opts Options, tlsConfig *tls.Config) []grpc.ServerOption {
	maxReq := opts.MaxRequestBytes
	if maxReq <= 0 {
		maxReq = etcdapi.DefaultMaxRequestBytes
	}
	out := []grpc.ServerOption{
		// Oversized requests must reach the handler, which answers with
		// etcd's "request is too large"; the transport limit only adds
		// headroom on top.
		grpc.MaxRecvMsgSize(maxReq + grpcOverheadBytes),
		grpc.MaxSendMsgSize(math.MaxInt32),
		grpc.MaxConcurrentStreams(math.MaxUint32),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Hour, Timeout: 20 * time.Second}),
		// Calls run on a pool of goroutines that keep the stacks they
		// grew, instead of a fresh goroutine per call growing its stack
		// again (DESIGN.md, "gRPC stream workers"). Calls beyond the pool
		// (and long-lived watch streams) still get their own goroutine.
		grpc.NumStreamWorkers(streamWorkers),
	}
	if tlsConfig != nil {
		out = append(out, grpc.Creds(credentials.NewTLS(tlsConfig)))
	}
	return out
}
