package linearizability

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"reflect"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/server"
)

// member is one in-process cluster node over a shared store, started the
// way servertest starts servers but on a fixed 127.0.0.1 address, so that a
// node killed and started again keeps its endpoint and the clients' lists
// stay valid.
type member struct {
	t     *testing.T
	name  string
	store kv.Store
	opts  server.ClusterOptions
	// tune, when set, adjusts the server's options before each start.
	tune func(*server.Options)
	addr string

	mu   sync.Mutex
	srv  *server.Server
	kill func()
}

func startMember(t *testing.T, name string, store kv.Store, opts server.ClusterOptions, tune func(*server.Options)) *member {
	t.Helper()
	m := &member{t: t, name: name, store: store, opts: opts, tune: tune, addr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	m.start()
	t.Cleanup(m.Kill)
	return m
}

func (m *member) start() {
	m.t.Helper()
	// ENGRAM_LIN_LOG=debug|info|warn shows the nodes' logs (default:
	// errors only).
	level := slog.LevelError
	if v := os.Getenv("ENGRAM_LIN_LOG"); v != "" {
		_ = level.UnmarshalText([]byte(v))
	}
	opts := server.Options{
		Store:               m.store,
		Logger:              slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("node", m.name),
		Name:                m.name,
		AdvertiseClientURLs: []string{"http://" + m.addr},
		Cluster:             m.opts,
	}
	opts.Cluster.Enabled = true
	if m.tune != nil {
		m.tune(&opts)
	}
	// A killed node's listener is closed before its kill returns (the
	// gRPC server's Stop closes it and Serve has returned), so its address
	// is free again.
	l, err := net.Listen("tcp", m.addr)
	if err != nil {
		m.t.Fatalf("%s: listen: %v", m.name, err)
	}
	srv, err := server.New(context.Background(), opts)
	if err != nil {
		_ = l.Close()
		m.t.Fatalf("%s: start: %v", m.name, err)
	}
	gopts := append(server.GRPCServerOptions(opts, nil), srv.Interceptors()...)
	if os.Getenv("ENGRAM_LIN_TRACE") != "" {
		name := m.name
		gopts = append(gopts, grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			start := time.Now()
			resp, err := handler(ctx, req)
			fmt.Fprintf(os.Stderr, "TRACE %s %s %s..%s %v -> %v err=%v\n", name, info.FullMethod, start.Format("15:04:05.000000"), time.Now().Format("15:04:05.000000"), req, resp, err)
			return resp, err
		}))
	}
	gs := grpc.NewServer(gopts...)
	srv.Register(gs)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(l)
	}()
	var once sync.Once
	m.mu.Lock()
	m.srv = srv
	m.kill = func() {
		once.Do(func() {
			// A crash as clients and the other members see it:
			// connections drop at once, the lease is not handed over.
			gs.Stop()
			<-served
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = srv.Close(ctx)
		})
	}
	m.mu.Unlock()
}

// Kill crashes the node (idempotent).
func (m *member) Kill() {
	m.mu.Lock()
	kill := m.kill
	m.mu.Unlock()
	if kill != nil {
		kill()
	}
}

// Restart starts a killed node again on the same store and address.
func (m *member) Restart() { m.start() }

// IsLeader is the running server's IsLeader.
func (m *member) IsLeader() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.srv.IsLeader()
}

// RoleChanged is the running server's RoleChanged.
func (m *member) RoleChanged() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.srv.RoleChanged()
}

// anyClosed waits until one of chans is closed (true) or ctx ends (false).
func anyClosed(ctx context.Context, chans ...<-chan struct{}) bool {
	cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())}}
	for _, c := range chans {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
	}
	chosen, _, _ := reflect.Select(cases)
	return chosen != 0
}
