package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	// startTimeout bounds one start until /readyz answers 200, recovery
	// after a crash included.
	startTimeout = 60 * time.Second
	// stopTimeout bounds one graceful stop: the server's shutdown-timeout
	// (set to 5s below) plus draining and closing the store.
	stopTimeout = 30 * time.Second
)

// nodeOptions shape one engram process.
type nodeOptions struct {
	// dataDir is reused across restarts; "" means a fresh t.TempDir().
	dataDir string
	// tls, when set, serves https:// with these files instead of http://.
	tls *tlsFiles
	// unixSocket, when set, serves on this socket instead of TCP.
	unixSocket string
	// args are extra flags, after the harness's own (so they win).
	args []string
	// clientPort, when set, is the TCP client port instead of a free one
	// picked at start: a test that must name the node's URL before it
	// starts (etcdctl member add) picks it first.
	clientPort int
	// env are extra environment variables (KEY=VALUE).
	env []string
}

// node is one engram subprocess and what a client needs to reach it.
type node struct {
	t    *testing.T
	opts nodeOptions
	name string

	clientPort int
	httpAddr   string
	// endpoint is what clientv3 and etcdctl dial: host:port,
	// https://host:port or unix:///path.
	endpoint string
	logPath  string

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait returned
	state  *os.ProcessState
}

// startNode starts engram and waits until it is ready. The process is killed
// at the end of the test if still running, and its log is printed if the
// test failed.
func startNode(t *testing.T, opts nodeOptions) *node {
	t.Helper()
	if opts.dataDir == "" {
		opts.dataDir = t.TempDir()
	}
	n := &node{t: t, opts: opts, name: "e2e-" + strings.ReplaceAll(t.Name(), "/", "-")}
	n.logPath = filepath.Join(t.TempDir(), "engram.log")
	t.Cleanup(func() {
		n.killIfRunning()
		if t.Failed() {
			n.dumpLog()
		}
	})
	// A port picked free may be taken before engram binds it; try again
	// with new ports rather than fail on that race.
	var err error
	for range 3 {
		n.pickPorts()
		if err = n.launch(); err == nil {
			return n
		}
		if !strings.Contains(n.readLog(), "address already in use") {
			break
		}
	}
	t.Fatalf("start engram: %v", err)
	return nil
}

func (n *node) pickPorts() {
	n.clientPort = n.opts.clientPort
	if n.clientPort == 0 {
		n.clientPort = freePort(n.t)
	}
	n.httpAddr = fmt.Sprintf("127.0.0.1:%d", freePort(n.t))
	switch {
	case n.opts.unixSocket != "":
		n.endpoint = "unix://" + n.opts.unixSocket
	case n.opts.tls != nil:
		n.endpoint = fmt.Sprintf("https://127.0.0.1:%d", n.clientPort)
	default:
		n.endpoint = fmt.Sprintf("127.0.0.1:%d", n.clientPort)
	}
}

// listenURL is the listen-client-urls entry for the current endpoint.
func (n *node) listenURL() string {
	switch {
	case n.opts.unixSocket != "":
		return "unix://" + n.opts.unixSocket
	case n.opts.tls != nil:
		return fmt.Sprintf("https://127.0.0.1:%d", n.clientPort)
	default:
		return fmt.Sprintf("http://127.0.0.1:%d", n.clientPort)
	}
}

func (n *node) args() []string {
	args := []string{
		"serve",
		"--name=" + n.name,
		"--data-dir=" + n.opts.dataDir,
		"--listen-client-urls=" + n.listenURL(),
		"--http.listen=" + n.httpAddr,
		"--log.level=debug",
		"--shutdown-timeout=5s",
	}
	if f := n.opts.tls; f != nil {
		args = append(args,
			"--tls.cert-file="+f.serverCert,
			"--tls.key-file="+f.serverKey,
			"--tls.client-ca-file="+f.caCert)
	}
	return append(args, n.opts.args...)
}

// launch starts the process (appending to the log) and waits for /readyz.
func (n *node) launch() error {
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "===== %s %s\n", suite.binary, strings.Join(n.args(), " "))
	cmd := exec.Command(suite.binary, n.args()...)
	cmd.Env = append(cleanEnv("ENGRAM_"), n.opts.env...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	n.cmd = cmd
	n.exited = make(chan struct{})
	n.state = nil
	go func() {
		_ = cmd.Wait()
		n.state = cmd.ProcessState
		logf.Close()
		close(n.exited)
	}()
	return n.waitReady()
}

func (n *node) waitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	for {
		resp, err := hc.Get("http://" + n.httpAddr + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		// Readiness lives in another process and /readyz is how it is
		// told, so it is asked again until it answers 200 (or the process
		// exits); startTimeout only guards against a hang.
		select {
		case <-ctx.Done():
			n.killIfRunning()
			return fmt.Errorf("engram not ready after %v (last error: %v)", startTimeout, err)
		case <-n.exited:
			return fmt.Errorf("engram exited before it was ready: %v", n.state)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM and requires a clean exit (status 0) within
// stopTimeout.
func (n *node) stop() {
	n.t.Helper()
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		n.t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-n.exited:
	case <-time.After(stopTimeout):
		n.killIfRunning()
		n.t.Fatalf("engram did not exit within %v of SIGTERM", stopTimeout)
	}
	if !n.state.Success() {
		n.t.Fatalf("engram exited uncleanly after SIGTERM: %v", n.state)
	}
}

// kill sends SIGKILL: a crash, with no chance to flush or clean up.
func (n *node) kill() {
	n.t.Helper()
	if err := n.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		n.t.Fatalf("SIGKILL: %v", err)
	}
	select {
	case <-n.exited:
	case <-time.After(stopTimeout):
		n.t.Fatalf("engram did not die within %v of SIGKILL", stopTimeout)
	}
}

// restart starts the process again on the same data directory and ports.
func (n *node) restart() {
	n.t.Helper()
	if err := n.launch(); err != nil {
		n.t.Fatalf("restart engram: %v", err)
	}
}

func (n *node) killIfRunning() {
	if n.cmd == nil || n.exited == nil {
		return
	}
	select {
	case <-n.exited:
	default:
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
}

func (n *node) readLog() string {
	b, _ := os.ReadFile(n.logPath)
	return string(b)
}

func (n *node) dumpLog() {
	lines := strings.Split(strings.TrimRight(n.readLog(), "\n"), "\n")
	if len(lines) > 200 {
		lines = lines[len(lines)-200:]
	}
	n.t.Logf("engram log (%s), last %d lines:\n%s", n.logPath, len(lines), strings.Join(lines, "\n"))
}

// client returns a clientv3 client for the node, closed at test end.
func (n *node) client(t *testing.T) *clientv3.Client {
	t.Helper()
	return n.clientWithTLS(t, n.clientTLS())
}

func (n *node) clientTLS() *tls.Config {
	if n.opts.tls == nil {
		return nil
	}
	return n.opts.tls.clientConfig(n.t, true)
}

func (n *node) clientWithTLS(t *testing.T, tc *tls.Config) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{n.endpoint},
		DialTimeout: 5 * time.Second,
		TLS:         tc,
	})
	if err != nil {
		t.Fatalf("clientv3.New(%s): %v", n.endpoint, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// etcdctl runs etcdctl against the node with stdin (may be empty) and
// returns its stdout; a non-zero exit fails the test.
func (n *node) etcdctl(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	out, errOut, err := n.etcdctlResult(t, stdin, args...)
	if err != nil {
		t.Fatalf("etcdctl %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// etcdctlResult runs etcdctl against the node and returns its output and
// exit error without judging them.
func (n *node) etcdctlResult(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	bin := needEtcdctl(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	full := append(n.etcdctlFlags(), args...)
	cmd := execEtcdctl(ctx, bin, full...)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

func (n *node) etcdctlFlags() []string {
	flags := []string{"--endpoints=" + n.endpoint, "--dial-timeout=5s", "--command-timeout=10s"}
	if f := n.opts.tls; f != nil {
		flags = append(flags, "--cacert="+f.caCert, "--cert="+f.clientCert, "--key="+f.clientKey)
	}
	return flags
}

// execEtcdctl prepares an etcdctl command with the v3 API selected and no
// ETCDCTL_* settings inherited from the caller's environment.
func execEtcdctl(ctx context.Context, bin string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(cleanEnv("ETCDCTL_"), "ETCDCTL_API=3")
	return cmd
}

// cleanEnv is the test process's environment without variables starting
// with prefix, so a developer's ENGRAM_* or ETCDCTL_* settings cannot change
// what a test runs.
func cleanEnv(prefix string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, prefix) {
			out = append(out, kv)
		}
	}
	return out
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pick a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// lineReader delivers the lines of a background process's stdout.
type lineReader struct {
	lines chan string
}

func newLineReader(r io.Reader) *lineReader {
	lr := &lineReader{lines: make(chan string, 1024)}
	go func() {
		defer close(lr.lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lr.lines <- sc.Text()
		}
	}()
	return lr
}

// next returns the next n lines, or what arrived before ctx ended.
func (lr *lineReader) next(ctx context.Context, n int) ([]string, error) {
	var got []string
	for len(got) < n {
		select {
		case l, ok := <-lr.lines:
			if !ok {
				return got, fmt.Errorf("output ended after %d of %d lines", len(got), n)
			}
			got = append(got, l)
		case <-ctx.Done():
			return got, fmt.Errorf("got %d of %d lines: %w", len(got), n, ctx.Err())
		}
	}
	return got, nil
}
