package mysqltest

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/engramkv/engram/internal/proctest"
)

// TestStartStop starts a server, checks it listens where it says and that
// its engram database and TCP root user work, and that Stop removes
// everything.
func TestStartStop(t *testing.T) {
	s, err := Launch()
	proctest.SkipIfMissing(t, err, ErrNotInstalled)
	c, err := net.DialTimeout("tcp", s.Addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dialing %s: %v\n%s", s.Addr, err, s.Log())
	}
	_ = c.Close()
	if s.Version == "" {
		t.Errorf("version unknown")
	}
	out, err := s.Exec("", "SELECT DATABASE(), COUNT(*) FROM mysql.user WHERE user = 'root' AND host = '127.0.0.1'")
	if err != nil || strings.TrimSpace(out) != Database+"\t1" {
		t.Errorf("Exec: %q, %v", out, err)
	}
	t.Logf("MariaDB %s on %s in %s", s.Version, s.Addr, s.Dir)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	proctest.CheckStopped(t, s.Dir, s.Addr)
}

// TestReaper checks the promise made for servers that are never stopped: a
// child test process launches a server and exits without Stop; the server
// must go away and its directory be removed anyway.
func TestReaper(t *testing.T) {
	_, err := findBins()
	proctest.SkipIfMissing(t, err, ErrNotInstalled)
	if proctest.CheckReaped(t, "MYSQLTEST_REAPER_CHILD", func() (string, string, error) {
		s, err := Launch()
		if err != nil {
			return "", "", err
		}
		return s.Dir, s.Addr, nil
	}) {
		os.Exit(0)
	}
}

// TestGaleraCluster starts a three-node cluster: a write on one node is
// read on another, and a killed node rejoins with the writes it missed.
// Stop removes everything.
func TestGaleraCluster(t *testing.T) {
	c, err := LaunchGalera(3)
	proctest.SkipIfMissing(t, err, ErrNotInstalled)
	stopped := false
	defer func() {
		if !stopped {
			_ = c.Stop()
		}
	}()
	exec := func(i int, sql string) string {
		t.Helper()
		out, err := c.Nodes[i].Exec("", "SET SESSION wsrep_sync_wait=1; "+sql)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out)
	}
	if got := exec(0, "SHOW STATUS LIKE 'wsrep_cluster_size'"); got != "wsrep_cluster_size\t3" {
		t.Fatalf("cluster size: %q", got)
	}
	exec(0, "CREATE TABLE t (k INT PRIMARY KEY) ENGINE=InnoDB; INSERT INTO t VALUES (1)")
	if got := exec(2, "SELECT COUNT(*) FROM t"); got != "1" {
		t.Fatalf("node 3 sees %s rows of node 1's write", got)
	}

	if err := c.Kill(1); err != nil {
		t.Fatal(err)
	}
	exec(0, "INSERT INTO t VALUES (2)")
	if err := c.Restart(1); err != nil {
		t.Fatal(err)
	}
	if got := exec(1, "SELECT COUNT(*) FROM t"); got != "2" {
		t.Fatalf("the restarted node sees %s rows, want the 2 written", got)
	}

	// Pause and quorum loss: tests/linearizability's Galera run.
	exec(0, "INSERT INTO t VALUES (3)")

	stopped = true
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, s := range c.Nodes {
		proctest.CheckStopped(t, s.Dir, s.Addr)
	}
}
