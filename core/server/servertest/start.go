package servertest

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/server"
)

func start(t testing.TB, store kv.Store, opts Options) *Server {
	logLevel := slog.LevelWarn
	if os.Getenv("ENGRAM_TEST_LOG") != "" {
		logLevel = slog.LevelDebug
	}
	sopts := server.Options{
		Store:                  store,
		Logger:                 slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel})),
		ProgressNotifyInterval: opts.ProgressNotifyInterval,
		Clock:                  opts.Clock,
		Name:                   "servertest",
		Auth:                   opts.Auth,
		QuotaBackendBytes:      opts.QuotaBackendBytes,
		Registerer:             opts.Registerer,
	}
	if opts.Name != "" {
		sopts.Name = opts.Name
	}
	if opts.Cluster != nil {
		sopts.Cluster = *opts.Cluster
		sopts.Cluster.Enabled = true
	}
	var (
		l        net.Listener
		err      error
		endpoint string
	)
	if opts.Unix {
		dir, derr := os.MkdirTemp("", "engram-sock")
		if derr != nil {
			t.Fatalf("servertest: socket dir: %v", derr)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		path := filepath.Join(dir, "engram.sock")
		l, err = net.Listen("unix", path)
		endpoint = "unix://" + path
		sopts.AdvertiseClientURLs = []string{endpoint}
	} else {
		l = opts.Listener
		if l == nil {
			l, err = net.Listen("tcp", "127.0.0.1:0")
		}
		if err == nil {
			endpoint = l.Addr().String()
			sopts.AdvertiseClientURLs = []string{"http://" + endpoint}
		}
	}
	if err != nil {
		t.Fatalf("servertest: listen: %v", err)
	}
	srv, err := server.New(context.Background(), sopts)
	if err != nil {
		t.Fatalf("servertest: start server: %v", err)
	}
	gs := grpc.NewServer(append(server.GRPCServerOptions(sopts, nil), srv.Interceptors()...)...)
	srv.Register(gs)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(l)
	}()
	var once sync.Once
	kill := func() {
		once.Do(func() {
			// A crash: connections drop at once; the node stops renewing
			// its lease without handing it over.
			gs.Stop()
			<-served
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = srv.Close(ctx)
		})
	}
	stop := func() {
		once.Do(func() {
			srv.Drain()
			stopped := make(chan struct{})
			go func() {
				gs.GracefulStop()
				close(stopped)
			}()
			select {
			case <-stopped:
			case <-time.After(5 * time.Second):
				gs.Stop()
			}
			<-served
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := srv.Close(ctx); err != nil {
				t.Errorf("servertest: close: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &Server{Endpoint: endpoint, stop: stop, kill: kill, srv: srv, quota: opts.QuotaBackendBytes}
}

func client(t testing.TB, s *Server) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{s.Endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("servertest: client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
