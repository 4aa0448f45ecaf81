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
