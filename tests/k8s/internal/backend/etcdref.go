//go:build etcdref

package backend

import (
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
)

const backendName = "etcd"

// startServer starts a fresh single-member etcd in-process, bound to
// 127.0.0.1 on ports picked by the kernel, with its data in t.TempDir(), and
// stops it on t.Cleanup. It returns the address to dial.
func startServer(t testing.TB) string {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Name = "ref"
	cfg.Dir = t.TempDir()
	// A throw-away single member that is never restarted: skip fsync.
	cfg.UnsafeNoFsync = true
	// Port 0: the listeners get free ports from the kernel, so concurrent
	// test processes cannot race for them. The peer URL is never dialled by
	// a single member; it only has to be consistent with InitialCluster.
	local := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls = []url.URL{local}
	cfg.AdvertiseClientUrls = []url.URL{local}
	cfg.ListenPeerUrls = []url.URL{local}
	cfg.AdvertisePeerUrls = []url.URL{local}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.WatchProgressNotifyInterval = ProgressNotifyInterval
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(
		zaptest.NewLogger(t, zaptest.Level(zapcore.ErrorLevel)).Named("etcd-server"))

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("starting etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		t.Fatal("etcd took too long to start")
	}
	go func() {
		// e.Err() is closed by e.Close; a value means the server failed.
		if err, ok := <-e.Err(); ok && err != nil {
			t.Errorf("etcd: %v", err)
		}
	}()
	if len(e.Clients) == 0 {
		t.Fatal("etcd has no client listener")
	}
	return e.Clients[0].Addr().String()
}
