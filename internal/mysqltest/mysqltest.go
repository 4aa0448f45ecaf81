// Package mysqltest starts throwaway MariaDB servers for tests: a fresh data
// directory under os.TempDir, a passwordless root user, listening on
// 127.0.0.1 at a port chosen at run time, its unix socket inside the data
// directory, with a database named engram; and throwaway Galera clusters of
// such servers (Cluster). The host's tests, the linearizability runs and
// the Kubernetes suite run Engram on the mysql.wasm plugin against them.
//
// It owns finding the MariaDB binaries (Debian's mariadb-server puts
// mariadbd in /usr/sbin, off a normal user's PATH), initialising the data
// directory with mariadb-install-db, running the server as the mysql user
// when the tests run as root, and waiting until it accepts connections.
// Running the process, and removing everything again even when the test
// process dies, is internal/proctest's.
//
// It must stay a test helper with no dependencies beyond the standard
// library and internal/proctest (the root module must not pull in a MySQL
// driver: Exec runs SQL through the mariadb client), and it must never
// touch a server it did not start.
package mysqltest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/engramkv/engram/internal/proctest"
)

// BinEnv names the environment variable that points at a directory holding
// mariadbd and mariadb-install-db, overriding the search.
const BinEnv = "ENGRAM_MARIADB_BIN"

// ErrNotInstalled is returned by Launch when no MariaDB binaries are found.
var ErrNotInstalled = errors.New("mysqltest: MariaDB binaries not found (apt-get install mariadb-server, or set " + BinEnv + ")")

// Database is the database every server starts with.
const Database = "engram"

// Server is a running throwaway MariaDB.
type Server struct {
	// Addr is "127.0.0.1:PORT", the address a plugin is allowed to dial.
	Addr string
	// Port is the TCP port.
	Port int
	// Dir holds the data directory and the unix socket.
	Dir string
	// Version is the server's version, e.g. "10.11.19-MariaDB".
	Version string

	bins   bins
	proc   *proctest.Proc
	galera *galeraNode // a node of a Cluster
}

// DSN returns a go-sql-driver/mysql DSN for database db (empty:
// Database) as root over TCP, in the form the mysql plugin takes.
func (s *Server) DSN(db string) string {
	if db == "" {
		db = Database
	}
	return fmt.Sprintf("root@tcp(%s)/%s", s.Addr, db)
}

// Start launches a server for t and stops it at t.Cleanup. Without
// MariaDB binaries it skips t, unless the environment variable CI is set,
// where a missing MariaDB is a broken CI machine and fails t.
func Start(t testing.TB) *Server {
	t.Helper()
	return proctest.StartFor(t, "MariaDB", Launch, ErrNotInstalled)
}

// Options change how Launch runs the server.
type Options struct {
	// Durable keeps InnoDB's durability on (the redo log flushed at every
	// commit, the doublewrite buffer: MariaDB's defaults), for benchmarks
	// that must pay for the disk as a real deployment does. Tests leave
	// it off. The binary log stays off either way.
	Durable bool
	// Settings are more mariadbd options (--NAME=VALUE), applied after the
	// package's own, so they override them.
	Settings []string
}

// Launch starts a server that the caller stops with Stop. If the process
// ends without calling Stop, the server is stopped and its directory removed
// anyway, so a server shared by all tests of a process may simply be left
// running.
func Launch() (*Server, error) { return LaunchWith(Options{}) }

// LaunchWith is Launch with options.
func LaunchWith(o Options) (*Server, error) {
	b, err := findBins()
	if err != nil {
		return nil, err
	}
	return proctest.Retry(3, func() (*Server, error) { return launch(b, o) })
}

// bins are the programs a server needs.
type bins struct {
	server, install, client string
}

// initStatements run before a new server accepts connections: the plugin
// connects over TCP from 127.0.0.1, which root@localhost does not cover with
// name resolution off.
const initStatements = "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';\n" +
	"GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;\n" +
	"CREATE DATABASE IF NOT EXISTS " + Database + ";\n"

func launch(b bins, o Options) (*Server, error) {
	dir, cred, err := proctest.TempDir("mysql", "engram-mysql-")
	if err != nil {
		return nil, fmt.Errorf("mysqltest: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := installDB(b, dir, cred); err != nil {
		return nil, err
	}
	initSQL, err := writeInitFile(dir)
	if err != nil {
		return nil, err
	}
	port, err := proctest.FreePort()
	if err != nil {
		return nil, fmt.Errorf("mysqltest: %w", err)
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: dir, bins: b}
	cmd := s.command(cred, o.Durable, initSQL)
	cmd.Args = append(cmd.Args, o.Settings...)
	// SIGTERM is mariadbd's normal shutdown.
	s.proc, err = proctest.Start("mariadbd", cmd, dir, syscall.SIGTERM, cred)
	if err != nil {
		return nil, fmt.Errorf("mysqltest: %w", err)
	}
	if err := s.waitReady(60 * time.Second); err != nil {
		_ = s.Stop()
		return nil, err
	}
	s.Version = serverVersion(b)
	ok = true
	return s, nil
}

// installDB creates the system database in dir/data. --no-defaults
// everywhere: the machine's /etc/mysql must not leak in. root@localhost
// (the unix socket, for Exec) authenticates with an empty password instead
// of the OS user.
func installDB(b bins, dir string, cred *syscall.Credential) error {
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(dir, "data"), "--auth-root-authentication-method=normal", "--skip-test-db"}
	if cred != nil {
		args = append(args, "--user=mysql")
	}
	install := exec.Command(b.install, args...)
	install.Dir = dir
	install.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := install.CombinedOutput(); err != nil {
		return fmt.Errorf("mysqltest: %s: %w\n%s", b.install, err, out)
	}
	return nil
}

// writeInitFile writes initStatements into dir for --init-file, which the
// server runs before it accepts connections, and returns its path.
func writeInitFile(dir string) (string, error) {
	initSQL := filepath.Join(dir, "init.sql")
	if err := os.WriteFile(initSQL, []byte(initStatements), 0o644); err != nil {
		return "", fmt.Errorf("mysqltest: %w", err)
	}
	return initSQL, nil
}

// command is the mariadbd command line of s, running as cred's user,
// with initSQL as its init file unless empty. Durability is off unless
// asked for (no flush at commit, no doublewrite), and there is no binary
// log: the data is thrown away, and tests should measure Engram, not the
// disk. max_connections covers a few stores of pooled plugin instances
// open at once. max_allowed_packet stays MariaDB's 16M (MySQL 8's is 64M),
// so that big batches take several round trips.
func (s *Server) command(cred *syscall.Credential, durable bool, initSQL string) *exec.Cmd {
	cmd := exec.Command(s.bins.server, "--no-defaults", "--datadir="+filepath.Join(s.Dir, "data"),
		"--port="+strconv.Itoa(s.Port), "--bind-address=127.0.0.1", "--skip-networking=0",
		"--socket="+filepath.Join(s.Dir, "sock"), "--pid-file="+filepath.Join(s.Dir, "pid"),
		"--skip-name-resolve", "--skip-log-bin",
		"--innodb-buffer-pool-size=64M", "--innodb-log-file-size=64M",
		"--max-connections=300")
	if initSQL != "" {
		cmd.Args = append(cmd.Args, "--init-file="+initSQL)
	}
	if !durable {
		cmd.Args = append(cmd.Args, "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0", "--sync-binlog=0")
	}
	if cred != nil {
		cmd.Args = append(cmd.Args, "--user=mysql")
	}
	return cmd
}

// serverVersion is what mariadbd --version names itself, e.g.
// "10.11.19-MariaDB-0+deb12u1"; empty if it cannot tell.
func serverVersion(b bins) string {
	v, err := exec.Command(b.server, "--version").Output()
	if err != nil {
		return ""
	}
	// "mariadbd  Ver 10.11.19-MariaDB-0+deb12u1 for debian-linux-gnu ..."
	if f := strings.Fields(string(v)); len(f) > 2 {
		return f[2]
	}
	return ""
}

// waitReady waits for the log line the server prints once it accepts
// connections (after running the init file) and for its port.
func (s *Server) waitReady(timeout time.Duration) error {
	err := s.proc.WaitReady(timeout, func() error {
		if !strings.Contains(s.proc.Log(), "ready for connections") {
			return errors.New("not ready")
		}
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
	if err != nil {
		return fmt.Errorf("mysqltest: %w", err)
	}
	return nil
}

// Exec runs SQL statements as root through the mariadb client over the
// unix socket, in database db (empty: Database), and returns what they
// print (tab-separated rows, no headers).
func (s *Server) Exec(db, sql string) (string, error) {
	if db == "" {
		db = Database
	}
	if s.bins.client == "" {
		return "", errors.New("mysqltest: no mariadb or mysql client found")
	}
	out, err := exec.Command(s.bins.client, "--no-defaults", "--socket="+filepath.Join(s.Dir, "sock"),
		"-uroot", "--batch", "--skip-column-names", "-e", sql, db).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("mysqltest: %s: %w\n%s", sql, err, out)
	}
	return string(out), nil
}

// Log returns what the server has printed so far.
func (s *Server) Log() string { return s.proc.Log() }

// Stop shuts the server down and removes its directory. It is safe to
// call more than once.
func (s *Server) Stop() error {
	if err := s.proc.Stop(); err != nil {
		return fmt.Errorf("mysqltest: %w", err)
	}
	return nil
}

// findBins finds mariadbd (or mysqld, MariaDB's old name), the
// install script, and the client.
func findBins() (bins, error) {
	first := func(dirs []string, names ...string) string {
		for _, d := range dirs {
			for _, n := range names {
				p := filepath.Join(d, n)
				if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
					return p
				}
			}
		}
		for _, n := range names {
			if p, err := exec.LookPath(n); err == nil {
				return p
			}
		}
		return ""
	}
	dirs := []string{"/usr/sbin", "/usr/bin", "/usr/local/mysql/bin"}
	if d := os.Getenv(BinEnv); d != "" {
		dirs = []string{d}
	}
	b := bins{
		server:  first(dirs, "mariadbd", "mysqld"),
		install: first(dirs, "mariadb-install-db", "mysql_install_db"),
		client:  first(dirs, "mariadb", "mysql"),
	}
	if b.server == "" || b.install == "" {
		if d := os.Getenv(BinEnv); d != "" {
			return b, fmt.Errorf("mysqltest: %s=%s has no mariadbd and mariadb-install-db", BinEnv, d)
		}
		return b, ErrNotInstalled
	}
	return b, nil
}
