// Package pgtest starts throwaway PostgreSQL servers for tests: a fresh data
// directory under os.TempDir, trust authentication, listening on 127.0.0.1
// at a port chosen at run time, its unix socket inside the data directory.
// The host's tests, the server tests and the Kubernetes suite run Engram on
// the postgres.wasm plugin against it.
//
// It owns finding the PostgreSQL binaries (Debian's postgresql package puts
// them in /usr/lib/postgresql/VERSION/bin), running initdb and postgres as
// the postgres user when the tests run as root (both refuse to run as root),
// and waiting until the server accepts connections. Running the process,
// and removing everything again even when the test process dies, is
// internal/proctest's.
//
// It must stay a test helper with no dependencies beyond the standard
// library and internal/proctest (the root module must not pull in a
// PostgreSQL driver), and it must never touch a PostgreSQL it did not
// start.
package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/engramkv/engram/internal/proctest"
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

	bin  string
	proc *proctest.Proc
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
	return proctest.StartFor(t, "PostgreSQL", Launch, ErrNotInstalled)
}

// Options change how Launch runs the server.
type Options struct {
	// Durable keeps PostgreSQL's durability on (fsync, synchronous_commit,
	// full_page_writes: its defaults), for benchmarks that must pay for
	// the disk as a real deployment does. Tests leave it off.
	Durable bool
	// Settings are more NAME=VALUE server settings (postgres -c), applied
	// after the package's own, so they override them.
	Settings []string
}

// Launch starts a server that the caller stops with Stop. If the process
// ends without calling Stop, the server is stopped and its directory removed
// anyway, so a server shared by all tests of a process may simply be left
// running.
func Launch() (*Server, error) { return LaunchWith(Options{}) }

// LaunchWith is Launch with options.
func LaunchWith(o Options) (*Server, error) {
	bin, version, err := findBin()
	if err != nil {
		return nil, err
	}
	return proctest.Retry(3, func() (*Server, error) { return launch(bin, version, o) })
}

func launch(bin, version string, o Options) (*Server, error) {
	dir, cred, err := proctest.TempDir("postgres", "engram-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--no-locale", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	port, err := proctest.FreePort()
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, User: "postgres", Dir: dir, Version: version, bin: bin}
	// fsync and friends are off unless asked for: the data is thrown away,
	// and tests should measure Engram, not the disk. max_connections
	// covers a few stores of pooled plugin instances open at once.
	args := []string{"-D", data, "-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=300", "-c", "shared_buffers=64MB"}
	if !o.Durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	for _, kv := range o.Settings {
		args = append(args, "-c", kv)
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	// SIGINT is PostgreSQL's fast shutdown: open sessions are ended.
	s.proc, err = proctest.Start("postgres", cmd, dir, syscall.SIGINT, cred)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
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

// waitReady polls pg_isready until the server accepts connections.
func (s *Server) waitReady(timeout time.Duration) error {
	err := s.proc.WaitReady(timeout, func() error {
		c := exec.Command(filepath.Join(s.bin, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-U", s.User, "-d", "postgres", "-t", "1")
		return c.Run()
	})
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return nil
}

// Exec runs SQL statements as the superuser through psql, in database db
// (empty: "postgres"), and returns what they print (unaligned rows, no
// headers). Tests use it to act on the server behind a plugin's back, such
// as ending its sessions.
func (s *Server) Exec(db, sql string) (string, error) {
	if db == "" {
		db = "postgres"
	}
	psql := filepath.Join(s.bin, "psql")
	if _, err := os.Stat(psql); err != nil {
		if psql, err = exec.LookPath("psql"); err != nil {
			return "", errors.New("pgtest: no psql found")
		}
	}
	out, err := exec.Command(psql, "-X", "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-U", s.User,
		"-d", db, "-At", "-v", "ON_ERROR_STOP=1", "-c", sql).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("pgtest: %s: %w\n%s", sql, err, out)
	}
	return string(out), nil
}

// Log returns what the server has printed so far.
func (s *Server) Log() string { return s.proc.Log() }

// Stop shuts the server down (fast shutdown: open sessions are ended) and
// removes its directory. It is safe to call more than once.
func (s *Server) Stop() error {
	if err := s.proc.Stop(); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return nil
}

// WasmCacheDir is proctest.WasmCacheDir, kept here for the tests that
// already call it from this package.
func WasmCacheDir(path string) (string, error) { return proctest.WasmCacheDir(path) }

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

// versionFromData reads the server's major version from its data
// directory, for binaries found outside Debian's versioned directories.
func (s *Server) versionFromData() string {
	b, err := os.ReadFile(filepath.Join(s.Dir, "data", "PG_VERSION"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
