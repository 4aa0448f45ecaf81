// Package etcdtest starts throwaway real etcd 3.6 servers for tests and
// runs the etcdctl and etcdutl of the same release, so that Engram's
// behaviour can be checked against etcd's own and real etcd snapshots can
// be made and restored. It also starts etcd 3.7 servers (Options.Release)
// for the API that release added (KV.RangeStream).
//
// It owns finding the binaries that `make etcd-tools` builds into bin/
// (etcd, etcdctl36 and etcdutl, 3.6.16, from the wrapper module bench/etcd;
// etcdctl is renamed so it cannot shadow Debian's etcdctl 3.4 that the
// end-to-end tests take from PATH; etcd37, 3.7.0, from bench/etcd37),
// starting a single-member etcd on
// 127.0.0.1 with client and peer ports chosen at run time, waiting until it
// is ready, and stopping it again when the test ends. It also owns the
// schema of the facts files recorded next to the snapshots it generates
// (SnapshotFacts).
//
// It must stay a test helper with no dependencies beyond the standard
// library (the etcd server and tools are separate processes, never linked
// into Engram's module), must bind only to 127.0.0.1, and must never touch
// an etcd it did not start or a data directory it was not given.
package etcdtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BinDirEnv names the environment variable that points at a directory
// holding etcd, etcdctl36 and etcdutl, overriding <repo root>/bin.
const BinDirEnv = "ENGRAM_ETCD_BIN_DIR"

// Module is the root module's path; the repository root is the directory
// whose go.mod declares it.
const Module = "github.com/engramkv/engram"

// Release is an etcd release line a server binary must belong to.
type Release string

// The releases etcdtest starts. Release36 is the default: the snapshots,
// facts and most differential tests are made with it.
const (
	Release36 Release = "3.6"
	Release37 Release = "3.7"
)

// serverFile is each release's server binary in the bin directory.
var serverFile = map[Release]string{Release36: "etcd", Release37: "etcd37"}

// ErrNotInstalled is returned by Find and FindServer when a binary is
// missing.
var ErrNotInstalled = errors.New("etcdtest: etcd binaries not found (make etcd-tools, or set " + BinDirEnv + ")")

// Binaries are the paths of the etcd 3.6 programs.
type Binaries struct {
	Etcd    string // the server
	Etcdctl string // etcdctl 3.6 (bin/etcdctl36)
	Etcdutl string // etcdutl 3.6
}

// Find locates the binaries: in $ENGRAM_ETCD_BIN_DIR when set, else in
// <repo root>/bin, the repo root found by walking up from the working
// directory to the go.mod of module github.com/engramkv/engram (tests run
// in their package's directory, nested modules such as tests/k8s included).
// It returns ErrNotInstalled (wrapped) when one is missing, and a plain
// error when the etcd found is not 3.6 (e.g. bin/etcd left linked to
// Debian's 3.4 by bench-tools' fallback).
func Find() (Binaries, error) {
	etcd, err := FindServer(Release36)
	if err != nil {
		return Binaries{}, err
	}
	dir := filepath.Dir(etcd)
	b := Binaries{
		Etcd:    etcd,
		Etcdctl: filepath.Join(dir, "etcdctl36"),
		Etcdutl: filepath.Join(dir, "etcdutl"),
	}
	for _, p := range []string{b.Etcdctl, b.Etcdutl} {
		if err := present(p); err != nil {
			return Binaries{}, err
		}
	}
	return b, nil
}

// FindServer locates the server binary of release rel (bin/etcd for 3.6,
// bin/etcd37 for 3.7) as Find does, and checks its version.
func FindServer(rel Release) (string, error) {
	name, ok := serverFile[rel]
	if !ok {
		return "", fmt.Errorf("etcdtest: no etcd %s server is built (make etcd-tools builds 3.6 and 3.7)", rel)
	}
	dir, err := binDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	if err := present(p); err != nil {
		return "", err
	}
	if err := checkVersion(p, rel); err != nil {
		return "", err
	}
	return p, nil
}

// present returns ErrNotInstalled (wrapped) unless file p exists.
func present(p string) error {
	if fi, err := os.Stat(p); err != nil || fi.IsDir() {
		return fmt.Errorf("%w: no %s", ErrNotInstalled, p)
	}
	return nil
}

// binDir is $ENGRAM_ETCD_BIN_DIR, else <repo root>/bin.
func binDir() (string, error) {
	if dir := os.Getenv(BinDirEnv); dir != "" {
		return dir, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bin"), nil
}

var (
	versionMu      sync.Mutex
	versionChecked = map[string]error{}
)

// checkVersion runs `etcd --version` once per path and process and checks
// the binary is of release rel: snapshots, facts and comparisons made with
// another release would not be what the tests claim.
func checkVersion(etcd string, rel Release) error {
	versionMu.Lock()
	defer versionMu.Unlock()
	if err, ok := versionChecked[etcd]; ok {
		return err
	}
	out, err := exec.Command(etcd, "--version").CombinedOutput()
	switch {
	case err != nil:
		err = fmt.Errorf("etcdtest: %s --version: %v\n%s", etcd, err, out)
	case !strings.Contains(string(out), "etcd Version: "+string(rel)+"."):
		err = fmt.Errorf("etcdtest: %s is not etcd %s.x (run make etcd-tools):\n%s", etcd, rel, out)
	}
	versionChecked[etcd] = err
	return err
}

// RepoRoot returns the directory of the go.mod of module
// github.com/engramkv/engram, walking up from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("etcdtest: %w", err)
	}
	for {
		if modulePath(filepath.Join(dir, "go.mod")) == Module {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("etcdtest: no go.mod of module %s above the working directory", Module)
		}
		dir = parent
	}
}

// modulePath returns the module line of a go.mod, "" when there is none.
func modulePath(gomod string) string {
	f, err := os.Open(gomod)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`)
		}
	}
	return ""
}

// Require returns the binaries, or skips t when they are missing, unless
// the environment variable CI is set, where missing binaries are a broken
// CI machine and fail t (the rule of internal/pgtest). A wrong etcd
// version always fails t: it would silently test against something else.
func Require(t testing.TB) Binaries {
	t.Helper()
	b, err := Find()
	skipOrFail(t, err)
	return b
}

// RequireServer returns the server binary of release rel, or skips or
// fails t as Require does.
func RequireServer(t testing.TB, rel Release) string {
	t.Helper()
	p, err := FindServer(rel)
	skipOrFail(t, err)
	return p
}

func skipOrFail(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrNotInstalled) && os.Getenv("CI") == "" {
		t.Skipf("%v; skipping (with CI set this fails)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// Options configure Start.
type Options struct {
	// DataDir, when set, is an existing data directory etcd runs on (e.g.
	// one made by Restore, or a stopped Etcd's DataDir); it belongs to the
	// caller and is left in place. Empty: a fresh directory under
	// t.TempDir().
	DataDir string
	// Args are extra etcd flags, appended after the ones Start sets.
	Args []string
	// Release is the server's release; empty means Release36. Only the
	// server changes: Etcdctl and Etcdutl stay the 3.6 tools.
	Release Release
}

// Etcd is a running etcd member.
type Etcd struct {
	// Endpoint is "127.0.0.1:PORT", the client address as etcdctl and
	// clientv3 take it.
	Endpoint string
	// ClientURL is "http://127.0.0.1:PORT".
	ClientURL string
	// PeerURL is the member's peer URL, also on 127.0.0.1.
	PeerURL string
	// DataDir is the data directory.
	DataDir string

	bins   Binaries
	cmd    *exec.Cmd
	log    *lockedWriter
	exited chan struct{} // closed when etcd has exited
	once   sync.Once
	err    error
}

// MemberName is the member name Start and Restore use, so a restored data
// directory belongs to the member Start runs.
const MemberName = "etcdtest"

// startTimeout bounds the wait for a started etcd to become ready; a
// single member elects itself within a second or two.
const startTimeout = 30 * time.Second

// Start launches etcd for t and stops it at t.Cleanup, printing its log
// there if t failed. It skips or fails t as Require does when the binaries
// are missing.
func Start(t testing.TB, opts Options) *Etcd {
	t.Helper()
	var bins Binaries
	if opts.Release == "" || opts.Release == Release36 {
		bins = Require(t)
	} else {
		bins = Binaries{Etcd: RequireServer(t, opts.Release)}
	}
	var lastErr error
	// The ports are picked by binding :0 and released before etcd binds
	// them; another process may take one in between, so try a few times.
	for range 3 {
		dataDir := opts.DataDir
		if dataDir == "" {
			// A subdirectory: etcd creates it with the permissions it
			// wants, and a failed attempt leaves nothing for the next.
			dataDir = filepath.Join(t.TempDir(), "etcd")
		}
		e, err := launch(bins, dataDir, opts.Args)
		if err == nil {
			t.Cleanup(func() {
				if err := e.Stop(); err != nil {
					t.Errorf("stopping etcd: %v", err)
				}
				if t.Failed() {
					t.Logf("etcd log (%s):\n%s", e.ClientURL, tail(e.Log(), 64<<10))
				}
			})
			return e
		}
		lastErr = err
		if !errors.Is(err, errPortTaken) {
			break
		}
	}
	t.Fatal(lastErr)
	return nil
}

var errPortTaken = errors.New("address already in use")

func launch(bins Binaries, dataDir string, args []string) (*Etcd, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	e := &Etcd{
		Endpoint:  "127.0.0.1:" + strconv.Itoa(ports[0]),
		ClientURL: "http://127.0.0.1:" + strconv.Itoa(ports[0]),
		PeerURL:   "http://127.0.0.1:" + strconv.Itoa(ports[1]),
		DataDir:   dataDir,
		bins:      bins,
		log:       &lockedWriter{b: &bytes.Buffer{}},
		exited:    make(chan struct{}),
	}
	// --unsafe-no-fsync: the data is thrown away (or restored from a
	// snapshot again), and tests should not wait on the disk. The initial
	// cluster flags matter only for a fresh directory; on an existing one
	// etcd takes its membership from the WAL.
	e.cmd = exec.Command(bins.Etcd,
		"--name", MemberName,
		"--data-dir", dataDir,
		"--listen-client-urls", e.ClientURL,
		"--advertise-client-urls", e.ClientURL,
		"--listen-peer-urls", e.PeerURL,
		"--initial-advertise-peer-urls", e.PeerURL,
		"--initial-cluster", MemberName+"="+e.PeerURL,
		"--unsafe-no-fsync",
	)
	e.cmd.Args = append(e.cmd.Args, args...)
	e.cmd.Stdout = e.log
	e.cmd.Stderr = e.log
	// etcd dies with the test process even when the test process is
	// killed and no cleanup runs (Linux; see procattr_linux.go).
	e.cmd.SysProcAttr = procAttr()
	if err := e.cmd.Start(); err != nil {
		return nil, fmt.Errorf("etcdtest: starting etcd: %w", err)
	}
	go func() {
		_ = e.cmd.Wait()
		close(e.exited)
	}()
	if err := e.waitReady(startTimeout); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

// waitReady polls /readyz, which answers 200 once the member has a leader
// and serves linearizable reads, until it does, etcd exits, or the timeout
// passes. Polling is the only way: readiness lives in etcd's process.
func (e *Etcd) waitReady(timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	client := &http.Client{Timeout: time.Second}
	for {
		resp, err := client.Get(e.ClientURL + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-e.exited:
			log := e.Log()
			if strings.Contains(log, "address already in use") {
				return fmt.Errorf("etcdtest: etcd exited during startup: %w", errPortTaken)
			}
			return fmt.Errorf("etcdtest: etcd exited during startup (%v):\n%s", e.cmd.ProcessState, tail(log, 16<<10))
		case <-deadline.C:
			return fmt.Errorf("etcdtest: etcd not ready after %v:\n%s", timeout, tail(e.Log(), 16<<10))
		case <-tick.C:
		}
	}
}

// Log returns what etcd has printed so far (its tail, when long).
func (e *Etcd) Log() string {
	e.log.mu.Lock()
	defer e.log.mu.Unlock()
	return e.log.b.String()
}

// Stop shuts etcd down (SIGTERM, then SIGKILL after 10s) and waits for it
// to exit; the data directory stays, so Start with Options{DataDir:
// e.DataDir} can run etcd on it again. It is safe to call more than once.
func (e *Etcd) Stop() error {
	e.once.Do(func() {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.exited:
		case <-time.After(10 * time.Second):
			_ = e.cmd.Process.Kill()
			<-e.exited
			e.err = errors.New("etcdtest: etcd did not stop within 10s; killed")
		}
	})
	return e.err
}

// Etcdctl runs etcdctl 3.6 with --endpoints set to this member.
func (e *Etcd) Etcdctl(t testing.TB, args ...string) (string, error) {
	t.Helper()
	return Etcdctl(t, append([]string{"--endpoints=" + e.Endpoint}, args...)...)
}

// toolTimeout bounds one etcdctl or etcdutl run.
const toolTimeout = 2 * time.Minute

// Etcdctl runs etcdctl 3.6 (bin/etcdctl36) with args and ETCDCTL_API=3,
// returning its standard output. Its standard error goes into the error
// only: 3.6 speaks only the v3 API and warns on stderr that ETCDCTL_API is
// an unrecognized variable, which must not end up in output tests parse.
// It skips or fails t as Require does when the binaries are missing.
func Etcdctl(t testing.TB, args ...string) (string, error) {
	t.Helper()
	return run(Require(t).Etcdctl, args)
}

// Etcdutl runs etcdutl 3.6 with args (and ETCDCTL_API=3, as Etcdctl),
// returning its standard output; standard error goes into the error.
func Etcdutl(t testing.TB, args ...string) (string, error) {
	t.Helper()
	return run(Require(t).Etcdutl, args)
}

func run(bin string, args []string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("etcdtest: %s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, tail(stderr.String(), 16<<10))
	}
	return stdout.String(), nil
}

// Restore restores an etcd snapshot file (as `etcdctl snapshot save`
// writes it, with its sha256 trailer) with `etcdutl snapshot restore` into
// a fresh data directory under t.TempDir() and returns the directory, for
// Start(t, Options{DataDir: dir}). The member is MemberName; its recorded
// peer URL is a placeholder, which a single member never dials.
func Restore(t testing.TB, snapshot string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "restored")
	peer := "http://127.0.0.1:2380"
	if _, err := Etcdutl(t, "snapshot", "restore", snapshot, "--data-dir", dir,
		"--name", MemberName, "--initial-cluster", MemberName+"="+peer,
		"--initial-advertise-peer-urls", peer); err != nil {
		t.Fatal(err)
	}
	return dir
}

// freePorts returns n distinct free ports on 127.0.0.1, holding all
// listeners until every port is picked so none is returned twice.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("etcdtest: picking a port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "[...]\n" + s[len(s)-n:]
}

// lockedWriter collects etcd's output; the exec package's copying
// goroutine writes to it while tests may read it.
type lockedWriter struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// Keep the tail only: a long test must not grow it without bound.
	if w.b.Len() > 1<<20 {
		rest := append([]byte(nil), w.b.Bytes()[w.b.Len()-(256<<10):]...)
		w.b.Reset()
		w.b.WriteString("[...]\n")
		w.b.Write(rest)
	}
	return w.b.Write(p)
}
