package linearizability

import (
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
)

// proc is one engram process, killed with SIGKILL and restarted on the same
// data directory and ports (the way tests/e2e runs the binary).
type proc struct {
	t        *testing.T
	name     string
	bin      string // the engram binary it runs
	args     []string
	endpoint string // host:port for clientv3
	httpAddr string
	logPath  string

	cmd    *exec.Cmd
	exited chan struct{}
}

// startProc starts engram serve with extra args and waits until it is
// ready. It is killed at the end of the test; its log's tail is printed if
// the test failed.
func startProc(t *testing.T, name string, extra ...string) *proc {
	t.Helper()
	return startProcOf(t, engramBinary(t), name, extra...)
}

// startProcOf is startProc with another engram binary (an earlier release,
// in the upgrade run).
func startProcOf(t *testing.T, bin, name string, extra ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, bin: bin, logPath: filepath.Join(t.TempDir(), name+".log")}
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			b, _ := os.ReadFile(p.logPath)
			lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
			t.Logf("%s log (%s), last lines:\n%s", name, p.logPath, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	dataDir := t.TempDir()
	var err error
	// A port picked free may be taken before engram binds it: try again
	// with new ports.
	for range 3 {
		client, http := freePort(t), freePort(t)
		p.endpoint = fmt.Sprintf("127.0.0.1:%d", client)
		p.httpAddr = fmt.Sprintf("127.0.0.1:%d", http)
		p.args = append([]string{
			"serve",
			"--name=" + name,
			"--data-dir=" + dataDir,
			"--listen-client-urls=http://" + p.endpoint,
			"--http.listen=" + p.httpAddr,
			"--log.level=info",
			"--shutdown-timeout=5s",
		}, extra...)
		if err = p.launch(); err == nil {
			return p
		}
		b, _ := os.ReadFile(p.logPath)
		if !strings.Contains(string(b), "address already in use") {
			break
		}
	}
	t.Fatalf("start %s: %v", name, err)
	return nil
}

func (p *proc) launch() error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "===== %s\n", strings.Join(p.args, " "))
	cmd := exec.Command(p.bin, p.args...)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ENGRAM_") {
			env = append(env, kv)
		}
	}
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	exited := p.exited
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	return p.waitReady()
}

// waitReady polls /readyz until it answers 200 (recovery after a crash
// included). The two minutes only guard against a hang: a start that
// compiles postgres.wasm (18 MB) on a loaded 2-core machine once took over
// one.
func (p *proc) waitReady() error {
	timeout := time.After(2 * time.Minute)
	hc := &http.Client{Timeout: time.Second}
	for {
		resp, err := hc.Get("http://" + p.httpAddr + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		// Readiness lives in another process and /readyz is how it is
		// told, so it is asked again until it answers 200 or the process
		// exits.
		select {
		case <-p.exited:
			return errors.New("engram exited before it was ready")
		case <-timeout:
			p.kill()
			return fmt.Errorf("not ready after two minutes (last error %v)", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill sends SIGKILL, if running, and waits for the process to die.
func (p *proc) kill() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// restart starts the process again on the same data directory and ports.
func (p *proc) restart() {
	p.t.Helper()
	p.restartAs(p.bin)
}

// restartAs starts the process again, on the same data directory and
// ports, from the binary bin.
func (p *proc) restartAs(bin string) {
	p.t.Helper()
	p.bin = bin
	if err := p.launch(); err != nil {
		p.t.Fatalf("restart %s: %v", p.name, err)
	}
}

// stop sends SIGTERM, as an operator's service manager does, and waits for
// the process to exit; one that outlives its shutdown timeout by far is
// killed and fails the test.
func (p *proc) stop() {
	p.t.Helper()
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		p.t.Errorf("%s did not exit within a minute of SIGTERM; killed", p.name)
		p.kill()
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
