// Package proctest runs throwaway server processes for tests: the pieces
// internal/pgtest (PostgreSQL) and internal/mysqltest (MariaDB) share. It
// picks free ports, runs a server as an unprivileged system user when the
// tests run as root (the database servers refuse to run as root), keeps the
// tail of its output, and stops it and removes its directory again, even
// when the test process dies: a small reaper process stops the server and
// deletes its directory as soon as the test process's end of a pipe
// closes. It also keeps compiled plugins between test processes
// (WasmCacheDir).
//
// It must stay a test helper with no dependencies beyond the standard
// library, and it must never touch a process it did not start.
package proctest

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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. It
// is released before the server binds it, and another process may take
// it in between: callers retry a failed start.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("picking a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Credential returns the named system user's credential when running as
// root, nil otherwise.
func Credential(name string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("running as root, the server must run as the %s user: %w", name, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("%s user has a non-numeric uid %q or gid %q", name, u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// TempDir makes a directory under os.TempDir for a server that runs as the
// named system user when the tests run as root, owned by that user, and
// returns the user's credential (nil when not root). os.TempDir, not
// t.TempDir: the server's user must be able to reach the directory, and
// t.TempDir's parents are private to the test's user.
func TempDir(user, pattern string) (string, *syscall.Credential, error) {
	cred, err := Credential(user)
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return "", nil, fmt.Errorf("chown %s to the %s user: %w", dir, user, err)
		}
	}
	return dir, cred, nil
}

// Proc is a running server process whose directory goes away with it.
type Proc struct {
	name   string
	dir    string
	sig    syscall.Signal
	cmd    *exec.Cmd
	reaper *exec.Cmd
	pipe   io.WriteCloser
	log    *LockedWriter
	exited chan struct{} // closed when the server has exited
	once   sync.Once
	err    error
}

// Start starts cmd (as cred's user when not nil, in a process group of
// its own, so a ^C to the test does not kill it before the reaper can
// stop it cleanly), collecting its output, and a reaper that sends it sig
// and removes dir once this process has gone. name names the server in
// errors.
func Start(name string, cmd *exec.Cmd, dir string, sig syscall.Signal, cred *syscall.Credential) (*Proc, error) {
	p := &Proc{name: name, dir: dir, sig: sig, cmd: cmd, log: &LockedWriter{}, exited: make(chan struct{})}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	cmd.Stdout = p.log
	cmd.Stderr = p.log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	if err := p.startReaper(); err != nil {
		_ = cmd.Process.Kill()
		<-p.exited
		return nil, err
	}
	return p, nil
}

// startReaper starts a shell that waits for end of file on its stdin (our
// end of the pipe closes when this process exits, however it exits) and then
// stops the server and removes the directory.
func (p *Proc) startReaper() error {
	script := `read _; kill -` + strconv.Itoa(int(p.sig)) + ` "$1" 2>/dev/null; i=0; while kill -0 "$1" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; kill -KILL "$1" 2>/dev/null; rm -rf "$2"`
	p.reaper = exec.Command("/bin/sh", "-c", script, "proctest-reaper", strconv.Itoa(p.cmd.Process.Pid), p.dir)
	p.reaper.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	w, err := p.reaper.StdinPipe()
	if err != nil {
		return fmt.Errorf("%s reaper: %w", p.name, err)
	}
	if err := p.reaper.Start(); err != nil {
		return fmt.Errorf("%s reaper: %w", p.name, err)
	}
	p.pipe = w
	return nil
}

// Signal sends the server sig (tests kill, pause and resume servers to
// make faults).
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Exited is closed when the server has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Log returns what the server has printed so far (its tail).
func (p *Proc) Log() string { return p.log.String() }

// WaitReady calls ready until it returns nil, the server exits, or timeout
// passes.
func (p *Proc) WaitReady(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v (%v):\n%s", p.name, timeout, err, p.Log())
		}
		// Readiness lives in the server's process and ready is the only
		// way to ask it, so it is asked again at a pace until it answers
		// or the server exits.
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited during startup:\n%s", p.name, p.Log())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop sends the server its stop signal, kills it if it has not exited
// within 20 s, and removes its directory. It is safe to call more than
// once.
func (p *Proc) Stop() error {
	p.once.Do(func() {
		p.err = p.stop()
	})
	return p.err
}

func (p *Proc) stop() error {
	var errs []error
	_ = p.cmd.Process.Signal(p.sig)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		errs = append(errs, fmt.Errorf("%s did not stop within 20s; killed", p.name))
	}
	if p.pipe != nil {
		// The reaper finds the server gone and removes what is left.
		_ = p.pipe.Close()
		_ = p.reaper.Wait()
	}
	if err := os.RemoveAll(p.dir); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", p.dir, err))
	}
	return errors.Join(errs...)
}

// LockedWriter collects a server's output; the server writes to it from
// the exec package's copying goroutine while tests may read it.
type LockedWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *LockedWriter) Write(p []byte) (int, error) {
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

// String returns what was written (its tail).
func (w *LockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// Retry runs launch up to tries times until it succeeds: a server started
// on a port from FreePort may lose the port to another process.
func Retry[S any](tries int, launch func() (S, error)) (S, error) {
	var s S
	var err error
	for range tries {
		if s, err = launch(); err == nil {
			return s, nil
		}
	}
	return s, err
}

// SkipIfMissing ends t when a server could not be launched: skipped when
// err is notInstalled (the binaries are missing), unless the environment
// variable CI is set, where a missing server is a broken CI machine and
// fails t; failed for any other error.
func SkipIfMissing(t testing.TB, err, notInstalled error) {
	t.Helper()
	if errors.Is(err, notInstalled) && os.Getenv("CI") == "" {
		t.Skipf("%v; skipping (with CI set this fails)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// BuiltFile returns the absolute path of rel (relative to the test's
// directory), a file a make target builds, such as bin/postgres.wasm. A
// missing file skips t, or fails it with CI set, like a missing server;
// target names the make target that builds it.
func BuiltFile(t testing.TB, rel, target string) string {
	t.Helper()
	path, err := filepath.Abs(rel)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing (make %s builds it): %v", path, target, err)
		}
		t.Skipf("%s is missing; run make %s", path, target)
	}
	return path
}

// StartFor launches a server for t with launch and stops it at t.Cleanup;
// see SkipIfMissing for what a failed launch does. name names the server
// in errors.
func StartFor[S interface{ Stop() error }](t testing.TB, name string, launch func() (S, error), notInstalled error) S {
	t.Helper()
	s, err := launch()
	SkipIfMissing(t, err, notInstalled)
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stopping %s: %v", name, err)
		}
	})
	return s
}

// CheckStopped checks that a stopped server left nothing behind: its
// directory is gone and its address refuses connections.
func CheckStopped(t *testing.T, dir, addr string) {
	t.Helper()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there after Stop: %v", dir, err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		_ = c.Close()
		t.Errorf("%s still accepts connections after Stop", addr)
	}
}

// CheckReaped checks the promise Start makes for servers that are never
// stopped. Called from a test named test, it runs the test binary again
// as a child with env=1 set, where child must launch a server and return
// its directory and address; the child exits without stopping it, and
// the server must go away and its directory be removed anyway. It returns
// true in the child (which has printed what the parent needs and should
// exit).
func CheckReaped(t *testing.T, env string, child func() (dir, addr string, err error)) bool {
	if os.Getenv(env) == "1" {
		dir, addr, err := child()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("DIR=%s ADDR=%s\n", dir, addr)
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$")
	cmd.Env = append(os.Environ(), env+"=1")
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
			return false
		}
		if time.Now().After(deadline) {
			t.Fatalf("15s after the child exited: dir %s stat=%v, %s dial=%v", dir, statErr, addr, dialErr)
		}
		// The server and its reaper are processes this one did not
		// start and cannot wait for; the directory and the port are
		// all it can observe of them, so they are checked again.
		time.Sleep(100 * time.Millisecond)
	}
}
