// Package pgtest starts throwaway PostgreSQL servers for tests: a fresh data
// directory under os.TempDir, trust authentication, listening on 127.0.0.1
// at a port chosen at run time, its unix socket inside the data directory.
// The host's tests, the server tests and the Kubernetes suite run Engram on
// the postgres.wasm plugin against it.
//
// It owns finding the PostgreSQL binaries (Debian's postgresql package puts
// them in /usr/lib/postgresql/VERSION/bin), running initdb and postgres as
// the postgres user when the tests run as root (both refuse to run as root),
// waiting until the server accepts connections, and removing everything
// again, even when the test process dies: a small reaper process stops the
// server and deletes its directory as soon as the test process's end of a
// pipe closes.
//
// It must stay a test helper with no dependencies beyond the standard
// library (the root module must not pull in a PostgreSQL driver), and it
// must never touch a PostgreSQL it did not start.
package pgtest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BinEnv names the environment variable that points at a directory holding
// initdb, postgres and pg_isready, overriding the search.
const BinEnv = "ENGRAM_PG_BIN"

// ErrNotInstalled is returned by Launch when no PostgreSQL binaries are
// found.
var ErrNotInstalled = errors.New("pgtest: PostgreSQL binaries not found (apt-get install postgresql, or set " + BinEnv + ")")

// Server is a running throwaway PostgreSQL.
type Server struct {
	// Addr is "127.0.0.1:PORT", the address a plugin is allowed to dial.
	Addr string
	// Port is the TCP port.
	Port int
	// User is the superuser, with trust authentication: "postgres".
	User string
	// Dir is the data directory (the unix socket lives there too).
	Dir string
	// Version is the server's major version, e.g. "15".
	Version string

	bin    string
	cmd    *exec.Cmd
	reaper *exec.Cmd
	pipe   io.WriteCloser
	log    *lockedWriter
	exited chan struct{} // closed when postgres has exited
	once   sync.Once
	err    error
}

// URL returns a connection URL for database db (empty: "postgres") as the
// superuser, without TLS, in the form the postgres plugin takes.
func (s *Server) URL(db string) string {
	if db == "" {
		db = "postgres"
	}
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", s.User, s.Addr, db)
}

// Start launches a server for t and stops it at t.Cleanup. Without
// PostgreSQL binaries it skips t, unless the environment variable CI is set,
// where a missing PostgreSQL is a broken CI machine and fails t.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := Launch()
	if errors.Is(err, ErrNotInstalled) && os.Getenv("CI") == "" {
		t.Skipf("%v; skipping (with CI set this fails)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stopping PostgreSQL: %v", err)
		}
	})
	return s
}

// Launch starts a server that the caller stops with Stop. If the process
// ends without calling Stop, the server is stopped and its directory removed
// anyway, so a server shared by all tests of a process may simply be left
// running.
func Launch() (*Server, error) {
	bin, version, err := findBin()
	if err != nil {
		return nil, err
	}
	var lastErr error
	// The port is picked by binding :0 and released before postgres binds
	// it; another process may take it in between, so try a few times.
	for range 3 {
		s, err := launch(bin, version)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func launch(bin, version string) (*Server, error) {
	cred, uid, gid, err := credential()
	if err != nil {
		return nil, err
	}
	// os.TempDir, not t.TempDir: the postgres user must be able to reach the
	// directory, and t.TempDir's parents are private to the test's user.
	dir, err := os.MkdirTemp("", "engram-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, fmt.Errorf("pgtest: chown %s to the postgres user: %w", dir, err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--no-locale", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, User: "postgres", Dir: dir, Version: version,
		bin: bin, log: &lockedWriter{b: &bytes.Buffer{}}, exited: make(chan struct{})}
	// fsync and friends are off: the data is thrown away, and tests should
	// measure Engram, not the disk. max_connections covers a few stores of
	// pooled plugin instances open at once.
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=300", "-c", "shared_buffers=64MB")
	// Own process group: a ^C to the test must not kill postgres before the
	// reaper can stop it cleanly and remove its directory.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	s.cmd.Stdout = s.log
	s.cmd.Stderr = s.log
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgtest: starting postgres: %w", err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	if err := s.startReaper(); err != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
		return nil, err
	}
	if s.Version == "" {
		s.Version = s.versionFromData()
	}
	if err := s.waitReady(30 * time.Second); err != nil {
		_ = s.Stop()
		return nil, err
	}
	ok = true
	return s, nil
}

// startReaper starts a shell that waits for end of file on its stdin (our
// end of the pipe closes when this process exits, however it exits) and then
// stops postgres and removes the directory.
func (s *Server) startReaper() error {
	script := `read _; kill -INT "$1" 2>/dev/null; i=0; while kill -0 "$1" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; kill -KILL "$1" 2>/dev/null; rm -rf "$2"`
	s.reaper = exec.Command("/bin/sh", "-c", script, "pgtest-reaper", strconv.Itoa(s.cmd.Process.Pid), s.Dir)
	s.reaper.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	w, err := s.reaper.StdinPipe()
	if err != nil {
		return fmt.Errorf("pgtest: reaper: %w", err)
	}
	if err := s.reaper.Start(); err != nil {
		return fmt.Errorf("pgtest: reaper: %w", err)
	}
	s.pipe = w
	return nil
}

// waitReady polls pg_isready until the server accepts connections.
func (s *Server) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c := exec.Command(filepath.Join(s.bin, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-U", s.User, "-d", "postgres", "-t", "1")
		if c.Run() == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("pgtest: postgres exited during startup:\n%s", s.Log())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: postgres not ready after %v:\n%s", timeout, s.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Log returns what the server has printed so far.
func (s *Server) Log() string {
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	return s.log.b.String()
}

// Stop shuts the server down (fast shutdown: open sessions are ended) and
// removes its directory. It is safe to call more than once.
func (s *Server) Stop() error {
	s.once.Do(func() {
		s.err = s.stop()
	})
	return s.err
}

func (s *Server) stop() error {
	var errs []error
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		errs = append(errs, errors.New("pgtest: postgres did not stop within 20s; killed"))
	}
	if s.pipe != nil {
		// The reaper finds postgres gone and removes what is left.
		_ = s.pipe.Close()
		_ = s.reaper.Wait()
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		errs = append(errs, fmt.Errorf("pgtest: removing %s: %w", s.Dir, err))
	}
	return errors.Join(errs...)
}

// credential returns the postgres user's credential when running as root
// (initdb and postgres refuse to run as root), nil otherwise.
func credential() (*syscall.Credential, int, int, error) {
	if os.Geteuid() != 0 {
		return nil, -1, -1, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, 0, 0, fmt.Errorf("pgtest: running as root, PostgreSQL must run as the postgres user: %w", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil, 0, 0, fmt.Errorf("pgtest: postgres user has a non-numeric uid %q or gid %q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid, gid, nil
}

// findBin returns the directory holding initdb, postgres and pg_isready,
// and the major version when it can tell.
func findBin() (string, string, error) {
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "postgres", "pg_isready"} {
			if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if d := os.Getenv(BinEnv); d != "" {
		if !has(d) {
			return "", "", fmt.Errorf("pgtest: %s=%s has no initdb, postgres and pg_isready", BinEnv, d)
		}
		return d, "", nil
	}
	// Debian installs versioned binaries outside PATH; take the newest.
	vers, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(vers, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(vers[i])))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(vers[j])))
		return a > b
	})
	for _, d := range vers {
		if has(d) {
			return d, filepath.Base(filepath.Dir(d)), nil
		}
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(real)) {
			return filepath.Dir(real), "", nil
		}
		if has(filepath.Dir(p)) {
			return filepath.Dir(p), "", nil
		}
	}
	return "", "", ErrNotInstalled
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: picking a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lockedWriter collects the server's output; postgres writes to it from
// the exec package's copying goroutine while tests may read it.
type lockedWriter struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// Keep the tail only: a long test run must not grow it without bound.
	if w.b.Len() > 1<<20 {
		tail := append([]byte(nil), w.b.Bytes()[w.b.Len()-(256<<10):]...)
		w.b.Reset()
		w.b.WriteString("[...]\n")
		w.b.Write(tail)
	}
	return w.b.Write(p)
}

// versionFromData reads the server's major version from its data
// directory, for binaries found outside Debian's versioned directories.
func (s *Server) versionFromData() string {
	b, err := os.ReadFile(filepath.Join(s.Dir, "data", "PG_VERSION"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
