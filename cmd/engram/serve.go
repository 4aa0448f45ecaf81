package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"

	"github.com/engramkv/engram/cmd/engram/internal/config"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/server"
)

func serveMain(args []string, stdout, stderr io.Writer) int {
	cfg, err := config.Load(args, stdout)
	if errors.Is(err, config.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "engram: %v\n\nRun 'engram serve --help' for usage.\n", err)
		return 2
	}
	logger := newLogger(cfg.Log, stderr)
	cfg.WarnUnknownEnv(logger)
	applyMemoryLimit(cfg.MemoryLimit, logger)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, stop, cfg, logger); err != nil {
		logger.Error("engram stopped with an error", "err", err)
		return 1
	}
	return 0
}

// applyMemoryLimit sets the Go runtime's soft memory limit from the
// memory-limit key, unless GOMEMLIMIT is set: the runtime has already applied
// that, and an operator's environment should win over a built-in default.
// 0 derives it from the cgroup (container) limit, else the machine's memory.
func applyMemoryLimit(limit int64, logger *slog.Logger) {
	if env := os.Getenv("GOMEMLIMIT"); env != "" {
		logger.Info("memory limit from GOMEMLIMIT; memory-limit ignored", "GOMEMLIMIT", env, "bytes", debug.SetMemoryLimit(-1))
		return
	}
	switch {
	case limit < 0:
		debug.SetMemoryLimit(math.MaxInt64)
	case limit == 0:
		set, err := memlimit.Set(
			memlimit.WithRatio(0.9),
			memlimit.WithProvider(memlimit.ApplyFallback(memlimit.FromCgroup, memlimit.FromSystem)),
		)
		if err != nil {
			logger.Warn("no automatic memory limit: cannot read the container's or machine's memory", "err", err)
			return
		}
		logger.Debug("memory limit set automatically", "bytes", set)
	default:
		debug.SetMemoryLimit(limit)
		logger.Debug("memory limit set", "bytes", limit)
	}
}

func newLogger(c config.Log, w io.Writer) *slog.Logger {
	var level slog.Level
	// config.Validate accepted only names slog knows.
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs the server until ctx is cancelled (a signal) or a listener
// fails, then shuts down in the order that loses no acknowledged write:
//
//  1. /readyz turns unready and the gRPC servers stop accepting;
//     in-flight calls get up to shutdown-timeout to finish, then the
//     remaining connections (typically watch streams) are cut;
//  2. server.Close finishes in-flight writes and stops background loops;
//  3. the store is closed, flushing the engine;
//  4. the HTTP endpoint goes last, so metrics stay scrapeable meanwhile.
//
// Steps 2 to 4 are the deferred calls below, in reverse order of start.
//
// unhook restores the default signal behaviour once shutdown starts: a
// second SIGINT/SIGTERM then kills the process at once, which is safe
// because every acknowledged write is already durable in the store.
func serve(ctx context.Context, unhook func(), cfg config.Config, logger *slog.Logger) (err error) {
	tlsConfig, err := loadTLS(cfg.TLS)
	if err != nil {
		return err
	}

	// Bind everything before the possibly long recovery, so a taken port
	// fails the start at once. Clients that connect meanwhile wait in the
	// accept backlog until gRPC serving starts.
	listeners, err := listenClientURLs(ctx, cfg.ListenClientURLs)
	if err != nil {
		return err
	}
	defer closeListeners(listeners) // no-op after the gRPC servers took them

	reg := newRegistry()
	ready := &readiness{}
	stopOps, err := startOpsEndpoint(ctx, cfg.HTTP.Listen, reg, ready, logger)
	if err != nil {
		return err
	}
	defer stopOps()

	store, err := openStore(ctx, cfg, logger.With("component", "storage"), reg)
	if err != nil {
		return err
	}
	defer func() { joinErr(&err, closeStore(store, logger)) }()

	opts, err := serverOptions(cfg, store, logger, reg, advertiseURLs(cfg, listeners))
	if err != nil {
		return err
	}
	logger.Info("recovering state", "engine", cfg.Storage.Engine)
	srv, err := server.New(ctx, opts)
	if err != nil {
		if ctx.Err() != nil {
			logger.Info("interrupted during recovery")
			return nil
		}
		return fmt.Errorf("start server: %w", err)
	}
	defer func() { joinErr(&err, closeServer(srv, cfg.ShutdownTimeout, logger)) }()

	grpcServers, serveErr := startGRPC(listeners, tlsConfig, opts, srv, logger)
	ready.setCheck(srv.Ready)
	logger.Info("engram started", "name", cfg.Name, "version", buildVersion())

	runErr := waitForStop(ctx, serveErr, logger)
	unhook()
	ready.draining.Store(true)
	// Watch and keepalive streams never end on their own; ending them
	// first (clients re-watch elsewhere) lets the graceful stop finish the
	// unary calls in flight without waiting out the timeout.
	srv.Drain()
	stopGRPC(cfg.ShutdownTimeout, logger, grpcServers...)
	return runErr
}

// newRegistry returns the registry /metrics serves, holding the Go
// runtime's, the process's and the build's metrics; the storage engine and
// the server add theirs.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
	)
	return reg
}

// startOpsEndpoint serves the operational HTTP endpoint (opsHandler) on addr,
// none when addr is empty, and returns the function that stops it.
func startOpsEndpoint(ctx context.Context, addr string, reg *prometheus.Registry, ready *readiness, logger *slog.Logger) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	var lc net.ListenConfig
	hl, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http.listen: %w", err)
	}
	httpSrv := &http.Server{
		Handler:           opsHandler(reg, ready),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	go func() {
		if err := httpSrv.Serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("http endpoint stopped", "err", err)
		}
	}()
	logger.Info("serving operational endpoint", "addr", hl.Addr().String(),
		"paths", "/metrics /healthz /readyz /debug/pprof/")
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := httpSrv.Shutdown(sctx); err != nil {
			_ = httpSrv.Close()
		}
	}, nil
}

// serverOptions turns the configuration into the server's options: the
// cluster's client certificate and the data directory's scratch space are
// read or prepared here, so their errors come before the recovery.
func serverOptions(cfg config.Config, store kv.Store, logger *slog.Logger, reg prometheus.Registerer, advertise []string) (server.Options, error) {
	clusterTLS, err := loadClusterTLS(cfg.Cluster.TLS)
	if err != nil {
		return server.Options{}, err
	}
	// memkv keeps nothing on disk, not even in the data directory.
	tempDir := ""
	if cfg.Storage.Engine != config.EngineMemKV {
		if tempDir, err = prepareTempDir(cfg.DataDir); err != nil {
			return server.Options{}, err
		}
	}
	return server.Options{
		Store:                  store,
		Logger:                 logger,
		Registerer:             reg,
		ProgressNotifyInterval: cfg.Watch.ProgressNotifyInterval,
		WatchMaxLag:            cfg.Watch.MaxLag,
		LatestCacheBytes:       cfg.Storage.LatestCacheSize,
		TempDir:                tempDir,
		Compaction: server.CompactionPolicy{
			Mode:      cfg.Compaction.Mode,
			Retention: cfg.Compaction.Retention,
			Revisions: cfg.Compaction.Revisions,
			Interval:  cfg.Compaction.Interval,
		},
		MaxRequestBytes:     cfg.Limits.MaxRequestBytes,
		MaxTxnOps:           cfg.Limits.MaxTxnOps,
		Name:                cfg.Name,
		AdvertiseClientURLs: advertise,
		Cluster: server.ClusterOptions{
			Enabled:       cfg.Cluster.Enabled,
			LeaseDuration: cfg.Cluster.LeaseDuration,
			RenewInterval: cfg.Cluster.RenewInterval,
			ClientTLS:     clusterTLS,
		},
		Auth: server.AuthOptions{
			Token:      cfg.Auth.Token,
			TokenTTL:   cfg.Auth.TokenTTL,
			BcryptCost: cfg.Auth.BcryptCost,
		},
		QuotaBackendBytes: cfg.QuotaBackendBytes,
	}, nil
}

// startGRPC serves the etcd v3 API on every listener. It returns the gRPC
// servers, for stopGRPC, and the channel a listener's failure arrives on.
//
// One gRPC server per transport: TLS credentials are a server option, so
// plaintext (http://, unix://) and TLS (https://) listeners cannot share
// one.
func startGRPC(listeners []clientListener, tlsConfig *tls.Config, opts server.Options, srv *server.Server, logger *slog.Logger) ([]*grpc.Server, <-chan error) {
	var plain, secure *grpc.Server
	serveErr := make(chan error, len(listeners))
	for _, l := range listeners {
		gs, tc := &plain, (*tls.Config)(nil)
		if l.secure() {
			gs, tc = &secure, tlsConfig
		}
		if *gs == nil {
			*gs = grpc.NewServer(append(server.GRPCServerOptions(opts, tc), srv.Interceptors()...)...)
			srv.Register(*gs)
		}
		go func(gs *grpc.Server, l clientListener) {
			if err := gs.Serve(l); err != nil {
				serveErr <- fmt.Errorf("serve %s: %w", l.url, err)
			}
		}(*gs, l)
		logger.Info("serving etcd v3 API", "url", l.url, "addr", l.Addr().String())
	}
	return []*grpc.Server{plain, secure}, serveErr
}

// waitForStop returns when a signal arrives (ctx ends), with nil, or when a
// listener fails, with its error.
func waitForStop(ctx context.Context, serveErr <-chan error, logger *slog.Logger) error {
	select {
	case <-ctx.Done():
		logger.Info("shutting down: signal received (a second signal kills the process at once)")
		return nil
	case err := <-serveErr:
		logger.Error("shutting down: listener failed", "err", err)
		return err
	}
}

// closeServer finishes the server's in-flight writes and stops its
// background loops. It has a timeout of its own, apart from the gRPC
// drain's, so a slow drain cannot eat the time the server needs to finish
// its writes.
func closeServer(srv *server.Server, timeout time.Duration, logger *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := srv.Close(ctx); err != nil {
		return fmt.Errorf("close server: %w", err)
	}
	logger.Info("server closed")
	return nil
}

// closeStore closes the storage engine, which flushes it.
func closeStore(store kv.Store, logger *slog.Logger) error {
	if err := store.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	logger.Info("store closed")
	return nil
}

// joinErr adds the error of a shutdown step, if any, to the error serve
// returns, which is left as it is when the step succeeded.
func joinErr(result *error, err error) {
	if err != nil {
		*result = errors.Join(*result, err)
	}
}

// stopGRPC gracefully stops every non-nil server at once: listeners close,
// in-flight calls run on. After timeout the remaining connections are cut.
func stopGRPC(timeout time.Duration, logger *slog.Logger, servers ...*grpc.Server) {
	var wg sync.WaitGroup
	done := make(chan struct{})
	var live []*grpc.Server
	for _, gs := range servers {
		if gs == nil {
			continue
		}
		live = append(live, gs)
		wg.Go(gs.GracefulStop)
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		logger.Info("grpc servers stopped gracefully")
	case <-time.After(timeout):
		logger.Info("grpc graceful stop timed out; closing remaining connections", "timeout", timeout)
		for _, gs := range live {
			gs.Stop()
		}
		<-done
	}
}

// advertiseURLs is what MemberList reports: advertise-client-urls when set,
// else the listen URLs, with a port 0 replaced by the port actually bound so
// clients are never told to dial port 0.
func advertiseURLs(cfg config.Config, listeners []clientListener) []string {
	if len(cfg.AdvertiseClientURLs) > 0 {
		return cfg.AdvertiseClientURLs
	}
	out := make([]string, 0, len(listeners))
	for _, l := range listeners {
		u := l.url
		if l.parsed.Scheme != "unix" {
			if _, port, err := net.SplitHostPort(l.parsed.Address); err == nil && port == "0" {
				u = l.parsed.Scheme + "://" + l.Addr().String()
			}
		}
		out = append(out, u)
	}
	return out
}

// prepareTempDir returns data-dir/tmp, emptied: snapshots being streamed and
// the sorted runs of HashKV go there, next to the data rather than in a
// small /tmp, and a crash can leave some behind.
func prepareTempDir(dataDir string) (string, error) {
	dir := filepath.Join(dataDir, "tmp")
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("data-dir: clear %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("data-dir: %w", err)
	}
	return dir, nil
}
