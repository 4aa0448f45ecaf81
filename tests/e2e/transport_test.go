package e2e

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestTLSClientCertAuth runs engram as kube-apiserver's etcd usually is:
// https only, with client certificate authentication (tls.client-ca-file).
func TestTLSClientCertAuth(t *testing.T) {
	t.Parallel()
	certs := newTLSFiles(t)
	n := startNode(t, nodeOptions{tls: certs})

	t.Run("clientv3 with client cert", func(t *testing.T) {
		cli := n.clientWithTLS(t, certs.clientConfig(t, true))
		ctx := testCtx(t, 30*time.Second)
		if _, err := cli.Put(ctx, "tls/k", "v"); err != nil {
			t.Fatalf("put over TLS with a client cert: %v", err)
		}
		get, err := cli.Get(ctx, "tls/k")
		if err != nil || len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "v" {
			t.Fatalf("get over TLS: %+v, %v", get, err)
		}
	})

	refused := func(t *testing.T, cli *clientv3.Client, what string) {
		t.Helper()
		// Refused at the TLS handshake, so the client retries until its
		// deadline; a short one keeps the test quick.
		ctx := testCtx(t, 3*time.Second)
		if _, err := cli.Get(ctx, "tls/k"); err == nil {
			t.Fatalf("%s: request succeeded, want it refused", what)
		}
	}
	t.Run("clientv3 without client cert is refused", func(t *testing.T) {
		refused(t, n.clientWithTLS(t, certs.clientConfig(t, false)), "TLS without a client certificate")
	})
	t.Run("clientv3 with cert from another CA is refused", func(t *testing.T) {
		refused(t, n.clientWithTLS(t, certs.rogueClientConfig(t)), "client certificate from an untrusted CA")
	})
	t.Run("plaintext to the TLS port is refused", func(t *testing.T) {
		cli, err := clientv3.New(clientv3.Config{
			Endpoints:   []string{strings.TrimPrefix(n.endpoint, "https://")},
			DialTimeout: 3 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		refused(t, cli, "plaintext gRPC to an https:// listener")
	})

	t.Run("etcdctl with client cert", func(t *testing.T) {
		needEtcdctl(t)
		wantOutput(t, "put", n.etcdctl(t, "", "put", "tls/etcdctl", "yes"), "OK\n")
		wantOutput(t, "get", n.etcdctl(t, "", "get", "tls/etcdctl"), "tls/etcdctl\nyes\n")
	})
	t.Run("etcdctl without client cert is refused", func(t *testing.T) {
		bin := needEtcdctl(t)
		ctx := testCtx(t, 30*time.Second)
		cmd := execEtcdctl(ctx, bin, "--endpoints="+n.endpoint, "--cacert="+certs.caCert,
			"--dial-timeout=2s", "--command-timeout=3s", "get", "tls/etcdctl")
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("etcdctl without --cert/--key succeeded: %s", out)
		}
	})
}

func TestUnixSocket(t *testing.T) {
	t.Parallel()
	// Socket paths are limited to ~108 bytes: keep it short rather than
	// under a long t.TempDir().
	dir, err := os.MkdirTemp("", "engram-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "engram.sock")

	n := startNode(t, nodeOptions{unixSocket: sock})
	cli := n.client(t)
	ctx := testCtx(t, 30*time.Second)
	if _, err := cli.Put(ctx, "unix/k", "v"); err != nil {
		t.Fatalf("put over %s: %v", n.endpoint, err)
	}
	if get, err := cli.Get(ctx, "unix/k"); err != nil || len(get.Kvs) != 1 {
		t.Fatalf("get over %s: %+v, %v", n.endpoint, get, err)
	}
	if suite.etcdctl != "" || os.Getenv("CI") != "" {
		wantOutput(t, "etcdctl get over unix socket", n.etcdctl(t, "", "get", "unix/k"), "unix/k\nv\n")
	}

	// A clean stop removes the socket file; a crash leaves it behind and
	// the next start must not trip over it.
	n.stop()
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket file after a clean stop: %v, want it removed", err)
	}
	n.restart()
	n.kill()
	if _, err := os.Lstat(sock); err != nil {
		t.Logf("socket file not left behind by SIGKILL (%v); stale-socket path not exercised", err)
	}
	n.restart()
	if get, err := n.client(t).Get(ctx, "unix/k"); err != nil || len(get.Kvs) != 1 {
		t.Fatalf("get after restart over a stale socket path: %+v, %v", get, err)
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

func TestOperationalEndpoint(t *testing.T) {
	t.Parallel()
	n := startNode(t, nodeOptions{})
	// Some traffic first, so request metrics (if any) have samples.
	if _, err := n.client(t).Put(testCtx(t, 30*time.Second), "ops/k", "v"); err != nil {
		t.Fatal(err)
	}
	base := "http://" + n.httpAddr

	for _, tc := range []struct {
		path, contains string
	}{
		{"/healthz", "ok"},
		{"/readyz", "ok"},
		{"/metrics", "go_goroutines"},
		{"/metrics", "process_start_time_seconds"},
		{"/debug/pprof/", "goroutine"},
		{"/debug/pprof/goroutine?debug=1", "goroutine profile"},
		{"/debug/pprof/cmdline", "engram"},
	} {
		code, body := httpGet(t, base+tc.path)
		if code != http.StatusOK || !strings.Contains(body, tc.contains) {
			t.Errorf("GET %s: %d, body lacks %q:\n%.500s", tc.path, code, tc.contains, body)
		}
	}
	if code, _ := httpGet(t, base+"/no-such-path"); code != http.StatusNotFound {
		t.Errorf("GET /no-such-path: %d, want 404", code)
	}
}

// TestMemKVFromEnvironment starts engram configured only through an ENGRAM_
// variable and checks the setting took effect: memkv keeps nothing across a
// restart.
func TestMemKVFromEnvironment(t *testing.T) {
	t.Parallel()
	n := startNode(t, nodeOptions{env: []string{"ENGRAM_STORAGE_ENGINE=memkv"}})
	ctx := testCtx(t, 60*time.Second)
	if _, err := n.client(t).Put(ctx, "mem/k", "v"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(n.readLog(), "memkv") {
		t.Errorf("log does not mention the memkv engine")
	}
	n.stop()
	n.restart()
	get, err := n.client(t).Get(ctx, "mem/k")
	if err != nil {
		t.Fatal(err)
	}
	if len(get.Kvs) != 0 || get.Header.Revision != 1 {
		t.Errorf("memkv after restart: %d keys at revision %d, want an empty store at revision 1", len(get.Kvs), get.Header.Revision)
	}
	if entries, _ := os.ReadDir(n.opts.dataDir); len(entries) != 0 {
		t.Errorf("memkv wrote into data-dir: %v", entries)
	}
}
