// Package backend starts the etcd-v3 server that Kubernetes' storage test
// suite runs against, and dials it the way the suite's own helpers expect.
//
// By default the server is Engram (core/server/servertest). Built with
// `-tags etcdref` it is a real etcd 3.6 started in-process instead, so the
// very same suite can be run against the reference implementation to tell
// failures of the suite (or of the harness) from failures of Engram.
//
// Every call to Client starts a fresh, empty server: the suite assumes that
// a new store has revision 1 and no keys.
package backend

import (
	"io"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/grpclog"

	storagetesting "k8s.io/apiserver/pkg/storage/testing"
)

// ProgressNotifyInterval is the period of server-side watch progress
// notifications. Kubernetes' own tests configure etcd with one second for the
// progress-notify and bookmark tests; we use it for every test so both
// backends are configured identically.
const ProgressNotifyInterval = time.Second

func init() {
	// gRPC's info and warning logs (reconnects, closed transports at test
	// teardown) drown the test output; keep errors only.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
}

// Name is the name of the backend the tests run against ("engram" or "etcd").
func Name() string { return backendName }

// Client starts a fresh server for t (stopped by t.Cleanup) and returns a
// client for it. Like the client built by the suite's own test server, its KV
// and Kubernetes interfaces are wrapped in the suite's recorders, which some
// tests use to count the requests the store sends.
func Client(t testing.TB) *kubernetes.Client {
	t.Helper()
	c, _ := ClientRecordingRanges(t)
	return c
}

// ClientRecordingRanges is Client that also returns the record of the Range
// and RangeStream RPCs the client sends.
func ClientRecordingRanges(t testing.TB) (*kubernetes.Client, *RangeRPCs) {
	t.Helper()
	return Dial(t, startServer(t))
}

// Dial connects to endpoint ("host:port" or "unix:///path") and closes the
// client on t.Cleanup.
func Dial(t testing.TB, endpoint string) (*kubernetes.Client, *RangeRPCs) {
	t.Helper()
	rpcs := &RangeRPCs{}
	c, err := kubernetes.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 10 * time.Second,
		DialOptions: append([]grpc.DialOption{grpc.WithBlock()}, rpcs.dialOptions()...),
		Logger:      zaptest.NewLogger(t, zaptest.Level(zapcore.ErrorLevel)).Named("etcd-client"),
	})
	if err != nil {
		t.Fatalf("dialing %s: %v", endpoint, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// The KV recorder also records streamed lists in the Kubernetes
	// recorder, where paginated lists land, so RunTestList sees both.
	lists := storagetesting.NewKubernetesRecorder(c.Kubernetes)
	c.Kubernetes = lists
	c.KV = storagetesting.NewKVRecorder(c.KV, lists)
	return c, rpcs
}
