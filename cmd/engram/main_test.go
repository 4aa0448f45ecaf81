package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/engramkv/engram/cmd/engram/internal/config"
)

func TestRunDispatch(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		contains string
	}{
		{[]string{"version"}, 0, "etcd API "},
		{[]string{"version"}, 0, "storage format 2 (reads 1 and newer)"},
		{[]string{"version"}, 0, "engram 0.10.0"},
		{[]string{"help"}, 0, "serve"},
		{[]string{"version", "extra"}, 2, "unexpected argument"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"serve", "--help"}, 0, "--listen-client-urls"},
		{[]string{"--storage.engine=rocks"}, 2, "storage.engine"},
		{[]string{"migrate", "--from=http://127.0.0.1:1", "--base=copy"}, 2, `unknown base mode "copy"`},
		{[]string{"migrate", "--from=http://127.0.0.1:1", "--idle-timeout=0s"}, 2, "--idle-timeout must be positive"},
		{[]string{"migrate", "--help"}, 0, "--base"},
	} {
		var out strings.Builder
		code := run(tc.args, &out, &out)
		if code != tc.code || !strings.Contains(out.String(), tc.contains) {
			t.Errorf("run(%q) = %d, output %q; want %d and %q", tc.args, code, out.String(), tc.code, tc.contains)
		}
	}
}

// shortTempDir keeps unix socket paths under the ~108-byte limit.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "engram-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestListenUnixReplacesStaleSocket(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(shortTempDir(t), "s.sock")

	// A socket file nobody serves on, as a killed process leaves it.
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("stale socket not left behind: %v", err)
	}

	l, err := listenUnix(ctx, path)
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	// A live socket is never taken over.
	if l2, err := listenUnix(ctx, path); err == nil {
		l2.Close()
		t.Fatal("second listener on a live socket succeeded")
	} else if !strings.Contains(err.Error(), "another process") {
		t.Errorf("live socket error %q does not say it is in use", err)
	}
	l.Close()

	// A regular file at the path is not a socket and is not removed.
	file := filepath.Join(shortTempDir(t), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if l, err := listenUnix(ctx, file); err == nil {
		l.Close()
		t.Fatal("listened over a regular file")
	}
	if _, err := os.Stat(file); err != nil {
		t.Errorf("regular file removed: %v", err)
	}
}

func TestListenClientURLsClosesOnError(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	sock := filepath.Join(shortTempDir(t), "s.sock")
	_, err = listenClientURLs(context.Background(), []string{"unix://" + sock, "http://" + taken.Addr().String()})
	if err == nil || !strings.Contains(err.Error(), taken.Addr().String()) {
		t.Fatalf("want an error naming %s, got %v", taken.Addr(), err)
	}
	// The unix listener bound before the failure was closed (and unlinked).
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket of the first URL still there after the failure: %v", err)
	}
}

func TestAdvertiseURLs(t *testing.T) {
	ls, err := listenClientURLs(context.Background(), []string{"http://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer closeListeners(ls)
	cfg := config.Default()
	got := advertiseURLs(cfg, ls)
	if want := []string{"http://" + ls[0].Addr().String()}; !slices.Equal(got, want) {
		t.Errorf("advertise for port 0: %q, want %q", got, want)
	}
	cfg.AdvertiseClientURLs = []string{"http://engram.example:2379"}
	if got := advertiseURLs(cfg, ls); !slices.Equal(got, cfg.AdvertiseClientURLs) {
		t.Errorf("configured advertise URLs not used: %q", got)
	}
}

func TestLoadTLSErrorsNameTheKey(t *testing.T) {
	if tc, err := loadTLS(config.TLS{}); tc != nil || err != nil {
		t.Errorf("no TLS configured: %v, %v; want nil, nil", tc, err)
	}
	_, err := loadTLS(config.TLS{CertFile: "/nonexistent.crt", KeyFile: "/nonexistent.key"})
	if err == nil || !strings.Contains(err.Error(), "tls.cert-file") {
		t.Errorf("missing key pair: %v", err)
	}
}

func TestLoadCAErrorsNameTheKey(t *testing.T) {
	_, err := loadClusterTLS(config.ClusterTLS{CAFile: "/nonexistent-ca.pem"})
	if err == nil || !strings.Contains(err.Error(), "cluster.tls.ca-file") {
		t.Errorf("missing cluster CA: %v", err)
	}
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = loadClusterTLS(config.ClusterTLS{CAFile: notPEM})
	if err == nil || !strings.Contains(err.Error(), "cluster.tls.ca-file: "+notPEM+" holds no PEM certificate") {
		t.Errorf("cluster CA without a certificate: %v", err)
	}
}

func TestOpsHandler(t *testing.T) {
	reg := prometheus.NewRegistry()
	ready := &readiness{}
	srv := httptest.NewServer(opsHandler(reg, ready))
	defer srv.Close()
	status := func(path string) int {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	if got := status("/readyz"); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz while recovering: %d, want 503", got)
	}
	if got := status("/healthz"); got != http.StatusOK {
		t.Errorf("/healthz: %d", got)
	}
	ready.setCheck(func() error { return nil })
	if got := status("/readyz"); got != http.StatusOK {
		t.Errorf("/readyz when serving: %d, want 200", got)
	}
	ready.setCheck(func() error { return errors.New("closed") })
	if got := status("/readyz"); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz when the server says not ready: %d, want 503", got)
	}
	ready.setCheck(func() error { return nil })
	ready.draining.Store(true)
	if got := status("/readyz"); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz while draining: %d, want 503", got)
	}
	for _, p := range []string{"/metrics", "/debug/pprof/", "/debug/pprof/cmdline"} {
		if got := status(p); got != http.StatusOK {
			t.Errorf("%s: %d", p, got)
		}
	}
}
