package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestStartStop starts a server, checks it listens where it says, and that
// Stop removes everything.
func TestStartStop(t *testing.T) {
	s, err := Launch()
	if err != nil {
		if err == ErrNotInstalled && os.Getenv("CI") == "" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", s.Addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dialing %s: %v\n%s", s.Addr, err, s.Log())
	}
	_ = c.Close()
	if s.Version == "" {
		t.Errorf("version unknown")
	}
	t.Logf("PostgreSQL %s on %s in %s", s.Version, s.Addr, s.Dir)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Errorf("%s still there after Stop: %v", s.Dir, err)
	}
	if _, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
		t.Errorf("%s still accepts connections after Stop", s.Addr)
	}
}

// TestReaper checks the promise made for servers that are never stopped: a
// child test process launches a server and exits without Stop; the server
// must go away and its directory be removed anyway.
func TestReaper(t *testing.T) {
	if os.Getenv("PGTEST_REAPER_CHILD") == "1" {
		s, err := Launch()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("DIR=%s ADDR=%s\n", s.Dir, s.Addr)
		os.Exit(0)
	}
	if _, _, err := findBin(); err != nil {
		if os.Getenv("CI") == "" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReaper$")
	cmd.Env = append(os.Environ(), "PGTEST_REAPER_CHILD=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var dir, addr string
	for _, f := range strings.Fields(string(out)) {
		if v, ok := strings.CutPrefix(f, "DIR="); ok {
			dir = v
		}
		if v, ok := strings.CutPrefix(f, "ADDR="); ok {
			addr = v
		}
	}
	if dir == "" {
		t.Fatalf("child printed no directory: %s", out)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, statErr := os.Stat(dir)
		c, dialErr := net.DialTimeout("tcp", addr, time.Second)
		if dialErr == nil {
			_ = c.Close()
		}
		if os.IsNotExist(statErr) && dialErr != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("15s after the child exited: dir %s stat=%v, %s dial=%v", dir, statErr, addr, dialErr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
