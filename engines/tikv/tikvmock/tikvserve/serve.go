// Package tikvserve serves client-go's in-process mock TiKV cluster
// (tikvmock) over the network, as PD and TiKV servers would: PD's gRPC
// service, the slice of etcd's API that client-go's safe point KV uses and
// the region statistics of PD's HTTP API that the adaptor's Size reads
// (pdhttp.go) on one address, and TiKV's gRPC service on one address per
// mock store.
// A client that knows only the PD address (tikv.Open, an engram process
// with storage.engine tikv) then reaches the mock exactly as it reaches a
// real cluster: PD client, safe point KV, and client-go's RPC client with
// its BatchCommands streams.
//
// It owns the listeners, the translation between the wire messages and
// the mock's calls, PD's timestamp oracle, a small in-memory etcd KV, and
// the faults a test drives: the whole cluster stopped and started on the
// same ports with the same data, and one store stopped and started, its
// regions' leadership moving to a live peer as Raft would.
//
// It exists for tests only and must never be used by production code:
// nothing is durable, there is no Raft, no replication and no scheduling,
// and every RPC it does not need to serve answers Unimplemented.
package tikvserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pingcap/kvproto/pkg/metapb"
	"github.com/pingcap/kvproto/pkg/pdpb"
	"github.com/pingcap/kvproto/pkg/tikvpb"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/engines/tikv/tikvmock"
)

// DefaultLeaderMoveDelay is Options.LeaderMoveDelay's default: about what
// TiKV's Raft takes to elect a new leader after one died (its election
// timeout is 10 ticks of 1 s at most; a few hundred milliseconds keeps the
// tests short while clients still meet the store-down window).
const DefaultLeaderMoveDelay = 500 * time.Millisecond

// maxResponse is the largest message a store sends, TiKV's default
// max-grpc-send-msg-len: the adaptor must size its scans to stay under it,
// as it must against TiKV.
const maxResponse = 10 << 20

// maxRequest bounds what a store or PD accepts (TiKV's own limit is far
// larger than grpc-go's 4 MiB default; prewrites of large values exceed it).
const maxRequest = 256 << 20

// Options configures New.
type Options struct {
	// LeaderMoveDelay is how long after StopStore the leadership of the
	// stopped store's regions moves to a live peer; 0 means
	// DefaultLeaderMoveDelay.
	LeaderMoveDelay time.Duration
	// Logger receives the calls that were not served (nil: slog.Default).
	Logger *slog.Logger
}

// Server serves one mock cluster. Its methods are safe for concurrent use.
type Server struct {
	mock   tikvmock.Mock
	log    *slog.Logger
	delay  time.Duration
	tso    *oracle
	etcd   *etcdKV
	pdAddr string
	// regionStats answers PD's HTTP region statistics (pdhttp.go).
	regionStats regionStatsFunc

	mu      sync.Mutex
	running bool // Stop was not called, or Start was since
	closed  bool
	pd      *grpc.Server // nil while stopped
	pdHTTP  *http.Server // PD's HTTP API, on the same port; nil while stopped
	pdSplit *splitListener
	stores  map[uint64]*store
	missing []string // methods answered Unimplemented, in order
}

// store is one mock TiKV store's listener.
type store struct {
	id   uint64
	addr string
	srv  *grpc.Server // nil while down
	// stopped is set by StopStore, cleared by StartStore: a stopped
	// store stays down across a whole-cluster Start.
	stopped bool
	// moved is closed when the leaders of the store's regions have moved
	// away after StopStore.
	moved chan struct{}
	timer *time.Timer
	// served counts the commands the store ran, across restarts.
	served atomic.Int64
}

// New gives every region of c three peers on three stores
// (tikvmock.Cluster.Replicate), registers a 127.0.0.1 address with a
// run-time port for each store in the mock, and serves PD and the stores
// until Close.
func New(c *tikvmock.Cluster, opts Options) (*Server, error) {
	if err := c.Replicate(); err != nil {
		return nil, fmt.Errorf("tikvserve: %w", err)
	}
	m, err := c.Mock()
	if err != nil {
		return nil, fmt.Errorf("tikvserve: %w", err)
	}
	s := &Server{
		mock:   m,
		log:    opts.Logger,
		delay:  opts.LeaderMoveDelay,
		tso:    &oracle{},
		stores: map[uint64]*store{},

		regionStats: c.RegionStats,
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.delay <= 0 {
		s.delay = DefaultLeaderMoveDelay
	}
	pdl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tikvserve: listen for PD: %w", err)
	}
	s.pdAddr = pdl.Addr().String()
	s.etcd = newEtcdKV(s.pdAddr)
	listeners := map[uint64]net.Listener{}
	closeAll := func() {
		_ = pdl.Close()
		for _, l := range listeners {
			_ = l.Close()
		}
	}
	for _, meta := range m.Cluster.GetAllStores() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("tikvserve: listen for store %d: %w", meta.GetId(), err)
		}
		listeners[meta.GetId()] = l
		// The mock finds a request's store by the address it was sent
		// to, so the store is registered under its listener's.
		m.Cluster.UpdateStoreAddr(meta.GetId(), l.Addr().String(), meta.GetLabels()...)
		s.stores[meta.GetId()] = &store{id: meta.GetId(), addr: l.Addr().String()}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running = true
	s.servePD(pdl)
	for id, l := range listeners {
		s.serveStore(s.stores[id], l)
	}
	return s, nil
}

// PDAddr is the address of PD (and of its etcd API), host:port.
func (s *Server) PDAddr() string { return s.pdAddr }

// Stores returns the stores' IDs in order.
func (s *Server) Stores() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]uint64, 0, len(s.stores))
	for id := range s.stores {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Served returns how many commands store id has run on the mock so far
// (0 for an unknown store): where the clients' requests went.
func (s *Server) Served(id uint64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.stores[id]; st != nil {
		return st.served.Load()
	}
	return 0
}

// Leaders returns, for each store, how many regions it leads.
func (s *Server) Leaders() map[uint64]int {
	n := map[uint64]int{}
	s.eachRegion(func(_ *metapb.Region, leader *metapb.Peer) { n[leader.GetStoreId()]++ })
	return n
}

// eachRegion calls fn with every region of the mock and its leader, in key
// order (region keys are encoded; the first starts at the empty key, the
// last ends at it).
func (s *Server) eachRegion(fn func(r *metapb.Region, leader *metapb.Peer)) {
	var key []byte
	for {
		r, leader, _ := s.mock.Cluster.GetRegionByKey(key)
		if r == nil {
			return
		}
		fn(r, leader)
		if len(r.GetEndKey()) == 0 {
			return
		}
		key = r.GetEndKey()
	}
}

// Unimplemented returns the full names of the methods that were called and
// answered Unimplemented, in call order: what a client needed that the
// fake does not serve.
func (s *Server) Unimplemented() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.missing)
}

// Stop stops PD and every store, dropping every connection: a whole
// cluster going down. The data stays; Start serves it again.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running = false
	s.stopAll()
}

// stopAll stops every server; s.mu is held.
func (s *Server) stopAll() {
	if s.pd != nil {
		_ = s.pdSplit.close()
		s.pd.Stop()
		_ = s.pdHTTP.Close()
		s.pd, s.pdHTTP, s.pdSplit = nil, nil, nil
	}
	for _, st := range s.stores {
		if st.srv != nil {
			st.srv.Stop()
			st.srv = nil
		}
	}
}

// Start serves PD and the stores again on their addresses after Stop
// (stores stopped with StopStore stay down).
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("tikvserve: closed")
	}
	if s.running {
		return nil
	}
	l, err := net.Listen("tcp", s.pdAddr)
	if err != nil {
		return fmt.Errorf("tikvserve: listen for PD again: %w", err)
	}
	s.running = true
	s.servePD(l)
	for _, st := range s.stores {
		if st.stopped {
			continue
		}
		if err := s.listenStore(st); err != nil {
			return err
		}
	}
	return nil
}

// StopStore stops store id's listener and drops its connections. After
// Options.LeaderMoveDelay the leadership of every region it leads moves to
// a peer on a live store; the returned channel is closed then. Until that,
// clients meet a dead store; after it, NotLeader answers and new leaders.
func (s *Server) StopStore(id uint64) (<-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stores[id]
	if st == nil {
		return nil, fmt.Errorf("tikvserve: no store %d", id)
	}
	if st.stopped {
		return st.moved, nil
	}
	st.stopped = true
	if st.srv != nil {
		st.srv.Stop()
		st.srv = nil
	}
	moved := make(chan struct{})
	st.moved = moved
	// The delay stands for Raft's election timeout inside the cluster, a
	// clock of the simulated system, not a wait of the test.
	st.timer = time.AfterFunc(s.delay, func() {
		defer close(moved)
		s.moveLeaders(id)
	})
	return moved, nil
}

// StartStore serves store id again on its address. Its regions' leaders
// stay where they moved, as after a real restart.
func (s *Server) StartStore(id uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stores[id]
	if st == nil {
		return fmt.Errorf("tikvserve: no store %d", id)
	}
	if !st.stopped {
		return nil
	}
	if st.timer.Stop() {
		close(st.moved) // never moved: nothing more will
	}
	st.stopped = false
	if !s.running {
		return nil // Start brings it up with the rest
	}
	return s.listenStore(st)
}

// Close stops everything for good.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed, s.running = true, false
	s.stopAll()
	for _, st := range s.stores {
		if st.timer != nil && st.timer.Stop() {
			close(st.moved)
		}
	}
}

// moveLeaders gives every region led by a peer on store dead a leader on a
// store that is up, as Raft's election would.
func (s *Server) moveLeaders(dead uint64) {
	s.mu.Lock()
	up := map[uint64]bool{}
	for id, st := range s.stores {
		up[id] = !st.stopped
	}
	s.mu.Unlock()
	s.eachRegion(func(r *metapb.Region, leader *metapb.Peer) {
		if leader.GetStoreId() != dead {
			return
		}
		if p := livePeer(r, up); p != nil {
			s.mock.Cluster.ChangeLeader(r.GetId(), p.GetId())
			s.log.Debug("tikvserve: leader moved", "region", r.GetId(), "from-store", dead, "to-store", p.GetStoreId())
		}
	})
}

func livePeer(r *metapb.Region, up map[uint64]bool) *metapb.Peer {
	for _, p := range r.GetPeers() {
		if up[p.GetStoreId()] {
			return p
		}
	}
	return nil
}

// listenStore listens on st's address again and serves it; s.mu is held.
func (s *Server) listenStore(st *store) error {
	l, err := net.Listen("tcp", st.addr)
	if err != nil {
		return fmt.Errorf("tikvserve: listen for store %d again: %w", st.id, err)
	}
	s.serveStore(st, l)
	return nil
}

// servePD serves PD's and etcd's gRPC services and PD's HTTP API on l
// (pdhttp.go); s.mu is held.
func (s *Server) servePD(l net.Listener) {
	srv := s.newGRPC()
	pdpb.RegisterPDServer(srv, &pdService{s: s})
	etcdserverpb.RegisterKVServer(srv, s.etcd)
	etcdserverpb.RegisterClusterServer(srv, s.etcd)
	s.pdSplit = splitPD(l)
	s.pd = srv
	s.pdHTTP = s.serveHTTP(s.pdSplit.http)
	go s.serve("PD", srv, s.pdSplit.grpc)
}

// serveStore serves st's TiKV service on l; s.mu is held.
func (s *Server) serveStore(st *store, l net.Listener) {
	srv := s.newGRPC(grpc.MaxSendMsgSize(maxResponse))
	tikvpb.RegisterTikvServer(srv, &tikvService{s: s, addr: st.addr, served: &st.served})
	st.srv = srv
	go s.serve(fmt.Sprintf("store %d", st.id), srv, l)
}

func (s *Server) serve(what string, srv *grpc.Server, l net.Listener) {
	if err := srv.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		s.log.Warn("tikvserve: serving stopped", "server", what, "err", err)
	}
}

// newGRPC returns a gRPC server with a health service (client-go probes a
// store that failed with one) and the Unimplemented log.
func (s *Server) newGRPC(opts ...grpc.ServerOption) *grpc.Server {
	opts = append(opts,
		grpc.MaxRecvMsgSize(maxRequest),
		// client-go and the PD client ping every 10 s, with or without
		// streams; grpc-go's default policy would answer that with
		// GOAWAY, which TiKV and PD never do.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			resp, err := h(ctx, req)
			s.noteMissing(info.FullMethod, err)
			return resp, err
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			err := h(srv, ss)
			s.noteMissing(info.FullMethod, err)
			return err
		}),
		// Services and methods that are not registered at all.
		grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
			method, _ := grpc.MethodFromServerStream(ss)
			err := status.Errorf(codes.Unimplemented, "tikvserve: %s is not served", method)
			s.noteMissing(method, err)
			return err
		}),
	)
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	return srv
}

func (s *Server) noteMissing(method string, err error) {
	if status.Code(err) != codes.Unimplemented {
		return
	}
	s.log.Warn("tikvserve: a client called what the fake does not serve", "method", method, "err", err)
	s.mu.Lock()
	s.missing = append(s.missing, method)
	s.mu.Unlock()
}
