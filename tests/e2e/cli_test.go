package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// runEngram runs the binary to completion and returns its combined output
// and exit code.
func runEngram(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, suite.binary, args...)
	cmd.Env = append(cleanEnv("ENGRAM_"), env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	default:
		t.Fatalf("run engram %q: %v\n%s", args, err, out)
		return "", -1
	}
}

func TestCommandLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		env      []string
		args     []string
		code     int
		contains []string
	}{
		{name: "version", args: []string{"version"}, code: 0, contains: []string{"engram ", "go1."}},
		{name: "help", args: []string{"help"}, code: 0, contains: []string{"serve", "version"}},
		{name: "serve --help lists every setting", args: []string{"serve", "--help"}, code: 0,
			contains: []string{"--listen-client-urls", "--storage.engine", "--tls.client-ca-file", "--http.listen", "ENGRAM_"}},
		{name: "unknown command", args: []string{"frobnicate"}, code: 2, contains: []string{`unknown command "frobnicate"`}},
		{name: "unknown flag", args: []string{"--no-such-flag"}, code: 2, contains: []string{"no-such-flag"}},
		{name: "invalid value names the key", args: []string{"--storage.engine=rocks"}, code: 2, contains: []string{"storage.engine", "rocks"}},
		{name: "invalid env names the variable", env: []string{"ENGRAM_LIMITS_MAX_TXN_OPS=many"}, code: 2,
			contains: []string{"limits.max-txn-ops", "ENGRAM_LIMITS_MAX_TXN_OPS"}},
		{name: "https without certificate", args: []string{"--listen-client-urls=https://127.0.0.1:0"}, code: 2,
			contains: []string{"listen-client-urls", "tls.cert-file"}},
		{name: "missing certificate file", args: []string{"--listen-client-urls=https://127.0.0.1:0", "--tls.cert-file=/nonexistent.crt",
			"--tls.key-file=/nonexistent.key", "--http.listen=", "--storage.engine=memkv"}, code: 1, contains: []string{"tls.cert-file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := runEngram(t, tc.env, tc.args...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; output:\n%s", code, tc.code, out)
			}
			for _, s := range tc.contains {
				if !strings.Contains(out, s) {
					t.Errorf("output lacks %q:\n%s", s, out)
				}
			}
		})
	}
}

// TestPortInUse: a client port that is taken fails the start with an error
// naming it, rather than serving on some other port.
func TestPortInUse(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	url := fmt.Sprintf("http://%s", l.Addr())
	out, code := runEngram(t, nil, "--listen-client-urls="+url, "--http.listen=", "--storage.engine=memkv")
	if code != 1 || !strings.Contains(out, url) || !strings.Contains(out, "address already in use") {
		t.Errorf("start on a taken port: exit %d, output:\n%s", code, out)
	}
}
