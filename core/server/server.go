// Package server assembles Engram's core (MVCC backend, watch hub, lessor,
// compaction policy) over one kv.Store and exposes it as the etcd v3 gRPC
// services.
//
// It owns the lifecycle of those parts: recovery on start, background loops,
// graceful shutdown that acknowledges no write it has not made durable. It does
// not open storage engines, parse configuration or listen on sockets; the
// binary in cmd/engram and the test harnesses do that and hand it a kv.Store.
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

	"github.com/engramkv/engram/core/etcdapi"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/lease"
	"github.com/engramkv/engram/core/mvcc"
	"github.com/engramkv/engram/core/watch"
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

	// ProgressNotifyInterval is how often a watch created with
	// progress_notify and no recent events gets a progress response
	// (etcd: --experimental-watch-progress-notify-interval, default 10m).
	ProgressNotifyInterval time.Duration
	// WatchMaxLag is how many revisions a watcher may fall behind the head
	// before it is cancelled with a reason; 0 uses the default, negative
	// disables the limit.
	WatchMaxLag int64

	// Compaction is the optional server-side compaction policy. The default
	// is off: kube-apiserver compacts by itself.
	Compaction CompactionPolicy

	// MaxRequestBytes bounds one request (etcd default 1.5 MiB).
	MaxRequestBytes int
	// MaxTxnOps bounds the operations in one Txn (etcd default 128).
	MaxTxnOps int

	// Name is this member's name in MemberList and Status.
	Name string
	// AdvertiseClientURLs are reported in MemberList.
	AdvertiseClientURLs []string
}

// CompactionPolicy is a server-side compaction schedule. Mode "" disables it.
type CompactionPolicy struct {
	// Mode is "", "periodic" or "revision".
	Mode string
	// Retention is the history kept for "periodic" (e.g. 1h): on every run
	// the server compacts to the revision it had Retention ago.
	Retention time.Duration
	// Revisions is the number of revisions kept for "revision".
	Revisions int64
	// Interval is how often the policy runs; 0 uses a default derived from
	// the mode.
	Interval time.Duration
}

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
	backend *mvcc.Backend
	hub     *watch.Hub
	api     *etcdapi.Services
	rpc     *rpcMetrics
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	ready   atomic.Bool
	closed  atomic.Bool
}

// ErrNotReady is returned by Ready until recovery has finished or after Close.
var ErrNotReady = errors.New("server: not ready")

// New recovers the state held in opts.Store and starts the background loops
// (lease expiry, compaction policy).
func New(ctx context.Context, opts Options) (*Server, error) {
	if opts.Store == nil {
		return nil, errors.New("server: no store")
	}
	if err := opts.Compaction.validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
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
	lessor := lease.New(lease.Options{})
	backend, err := mvcc.Open(ctx, mvcc.Options{Store: opts.Store, Lessor: lessor, Logger: log.With("component", "mvcc"), Registerer: opts.Registerer})
	if err != nil {
		return nil, fmt.Errorf("server: recover state: %w", err)
	}
	hub := watch.NewHub(backend, watch.Options{
		ProgressInterval: opts.ProgressNotifyInterval,
		MaxLag:           opts.WatchMaxLag,
		IsCompacted:      func(err error) bool { return errors.Is(err, mvcc.ErrCompacted) },
		Logger:           log.With("component", "watch"),
		Metrics:          watch.NewMetrics(opts.Registerer),
	})
	backend.SetNotifier(hub)
	api := etcdapi.New(etcdapi.Options{
		Backend:    backend,
		Hub:        hub,
		Store:      opts.Store,
		Limits:     etcdapi.Limits{MaxRequestBytes: opts.MaxRequestBytes, MaxTxnOps: opts.MaxTxnOps},
		Logger:     log.With("component", "api"),
		Name:       opts.Name,
		ClientURLs: opts.AdvertiseClientURLs,
		Version:    version.Version,
	})
	runCtx, cancel := context.WithCancel(context.Background())
	s := &Server{opts: opts, log: log, backend: backend, hub: hub, api: api, cancel: cancel, rpc: newRPCMetrics(opts.Registerer)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		lessor.Run(runCtx, log.With("component", "lease"), func(ctx context.Context, id int64) error {
			_, err := backend.RevokeLease(ctx, id)
			if errors.Is(err, mvcc.ErrLeaseNotFound) {
				return nil
			}
			return err
		}, time.Second)
	}()
	if opts.Compaction.Mode != "" {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.runCompactionPolicy(runCtx)
		}()
	}
	s.ready.Store(true)
	return s, nil
}

// Register registers the etcd services on gs.
func (s *Server) Register(gs *grpc.Server) { s.api.Register(gs) }

// Ready returns nil while the server is serving.
func (s *Server) Ready() error {
	if !s.ready.Load() || s.closed.Load() {
		return ErrNotReady
	}
	return nil
}

// Rev returns the current revision.
func (s *Server) Rev() int64 { return s.backend.Rev() }

// Close stops the server: queued writes are committed and acknowledged,
// watchers end, background loops stop. It does not close the store. Call it
// after the gRPC server stopped accepting requests.
func (s *Server) Close(ctx context.Context) error {
	if s.closed.Swap(true) {
		return nil
	}
	s.cancel()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		s.hub.Close()
		_ = s.backend.Close()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("server: close: %w", ctx.Err())
	}
}

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
	}
	if tlsConfig != nil {
		out = append(out, grpc.Creds(credentials.NewTLS(tlsConfig)))
	}
	return out
}
