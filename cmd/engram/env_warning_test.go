package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// asEngram, set in a child's environment, makes the test binary run the
// command line as the engram binary does (main's run) instead of the tests,
// so a test can start the real server code as its own process. It has no
// ENGRAM_ prefix on purpose: it is the test's variable, not one under test.
const asEngram = "BE_ENGRAM_BINARY"

func TestMain(m *testing.M) {
	if os.Getenv(asEngram) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestWrapperExportingEngramBinStarts runs the server the way a new user's
// wrapper script does, exporting its own ENGRAM_BIN before exec'ing the
// binary: the server starts (it used to refuse: "unknown variable"), and the
// log warns once about ENGRAM_BIN, by name, as etcd warns about an unknown
// ETCD_* variable.
func TestWrapperExportingEngramBinStarts(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(t.TempDir(), "run-engram.sh")
	script := "#!/bin/sh\nENGRAM_BIN=\"$1\"\nexport ENGRAM_BIN\nshift\nexec \"$ENGRAM_BIN\" \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	// A deadline for a hung child only; nothing is asserted on time.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, wrapper, self, "serve", "--storage.engine=memkv",
		"--listen-client-urls=http://127.0.0.1:0", "--http.listen=", "--log.format=json")
	// The developer's own ENGRAM_* settings must not change what starts.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ENGRAM_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, asEngram+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	// Read the log up to the start line (or the end of the log if the
	// server exits instead).
	var warned []string
	var logged []string
	started := false
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		logged = append(logged, sc.Text())
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		if line["msg"] == "unrecognized environment variable" {
			if line["level"] != "WARN" {
				t.Errorf("warning logged at level %v, want WARN", line["level"])
			}
			warned = append(warned, line["environment-variable"].(string))
		}
		if line["msg"] == "engram started" {
			started = true
			break
		}
	}
	if !started {
		_ = cmd.Wait()
		t.Fatalf("server did not start under a wrapper exporting ENGRAM_BIN (exit %v); log:\n%s", cmd.ProcessState, strings.Join(logged, "\n"))
	}
	if len(warned) != 1 || warned[0] != "ENGRAM_BIN" {
		t.Errorf("warnings name %q, want exactly [ENGRAM_BIN]; log:\n%s", warned, strings.Join(logged, "\n"))
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go func() { // drain the rest of the log so the child never blocks on it
		for sc.Scan() {
		}
	}()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("server did not stop cleanly on SIGTERM: %v", err)
	}
}
