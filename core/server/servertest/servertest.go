// Package servertest starts a complete Engram server in-process on 127.0.0.1
// for tests: on the store the caller passes, a random port, stopped by
// t.Cleanup. It exists so every test suite (e2e, Kubernetes storage tests,
// benchmarks) starts the server the same way; it must not be imported by
// non-test code paths of the server binary.
//
// It takes its store rather than choosing one, so it imports no engine: the
// core must not depend on the plugins built on it (callers pass
// memkv.New(), or any kv.Store).
//
// It is public because test suites outside the core (the host's, the
// adaptors', the end-to-end and Kubernetes suites, in other modules too)
// start servers with it.
package servertest

import (
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/engramkv/engram/core/internal/clock"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/server"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Options tune the started server. The zero value is a server with etcd's
// defaults.
type Options struct {
	// ProgressNotifyInterval as in server.Options.
	ProgressNotifyInterval time.Duration
	// Clock as in server.Options: nil is the system clock; core's tests
	// pass a fake one to advance time instead of waiting for it.
	Clock clock.Clock
	// Unix serves on a unix socket in t.TempDir() instead of TCP.
	Unix bool
	// Listener, when set, is the TCP listener to serve on (its address is
	// advertised) instead of a new one: a test that must know a node's URL
	// before the node starts (etcdctl member add) opens it first.
	Listener net.Listener
	// Name is the member name (default "servertest"); cluster members need
	// distinct names.
	Name string
	// Cluster, when set, runs the node as a member of a cluster over the
	// store passed to Start, which the members share.
	Cluster *server.ClusterOptions
	// Auth as in server.Options (token type and lifetimes).
	Auth server.AuthOptions
	// QuotaBackendBytes as in server.Options; 0 sets no quota.
	QuotaBackendBytes int64
	// Registerer as in server.Options: nil registers no metrics.
	Registerer prometheus.Registerer
}

// Server is a running in-process server.
type Server struct {
	// Endpoint is what an etcd client dials: "127.0.0.1:PORT" or
	// "unix:///path".
	Endpoint string

	stop  func()
	kill  func()
	srv   *server.Server
	quota int64
}

// Kill stops the server the way a crash would look to clients and to the
// other members: connections drop at once and the lease is not handed
// over. (Writes the server already accepted still finish: the process is
// simulated, not killed; the e2e tests use SIGKILL on a real process.)
func (s *Server) Kill() { s.kill() }

// IsLeader reports whether the node serves as leader of its cluster.
func (s *Server) IsLeader() bool { return s.srv.IsLeader() }

// Leader returns the name of the member the node serves as leader or
// forwards to; ok is false while it knows none.
func (s *Server) Leader() (name string, ok bool) { return s.srv.Leader() }

// RoleChanged returns a channel closed at the node's next change of role;
// see server.Server.RoleChanged.
func (s *Server) RoleChanged() <-chan struct{} { return s.srv.RoleChanged() }

// Stop shuts the server down now (gracefully: queued writes are committed);
// it also runs at cleanup. It does not close the store, so a test can start
// a new server on the same store to simulate a restart.
func (s *Server) Stop() { s.stop() }

// Start starts a server on store and registers its shutdown with t.Cleanup.
// The store stays the caller's to close.
func Start(t testing.TB, store kv.Store, opts Options) *Server {
	t.Helper()
	if store == nil {
		t.Fatal("servertest.Start: nil store (pass memkv.New() for an in-memory one)")
	}
	return start(t, store, opts)
}

// Client returns a clientv3 client connected to s, closed by t.Cleanup.
func (s *Server) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return client(t, s)
}
