package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// suite holds what TestMain prepares once for every test: read-only after
// TestMain, so tests may run in parallel.
var suite struct {
	binary  string // path of the engram binary under test
	etcdctl string // path of etcdctl, "" when not installed
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	bin := os.Getenv("E2E_ENGRAM_BINARY")
	if bin == "" {
		dir, err := os.MkdirTemp("", "engram-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "engram")
		if err := buildEngram(bin); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: building the engram binary failed:", err)
			return 1
		}
	}
	suite.binary = bin
	suite.etcdctl, _ = exec.LookPath("etcdctl")
	return m.Run()
}

// buildEngram compiles cmd/engram the way `make build` does, so the tests
// exercise the binary that ships rather than an in-process server.
func buildEngram(out string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", out, "github.com/engramkv/engram/cmd/engram")
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	return cmd.Run()
}

// needEtcdctl returns the etcdctl path, or skips the test when etcdctl is
// not installed on a developer machine. In CI (CI set) its absence is a
// failure: .ci/run installs it, so missing means the setup broke.
func needEtcdctl(t *testing.T) string {
	t.Helper()
	if suite.etcdctl != "" {
		return suite.etcdctl
	}
	if os.Getenv("CI") != "" {
		t.Fatal("etcdctl not found in PATH, and CI is set: .ci/run should have installed it (Debian package etcd-client)")
	}
	t.Skip("etcdctl not found in PATH: install it (apt-get install etcd-client) to run this test")
	return ""
}
