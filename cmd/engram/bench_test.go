package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/engramkv/engram/bench/result"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
)

// TestBenchSubcommand runs `engram bench` briefly against an in-process
// server and checks the table and the JSON report.
func TestBenchSubcommand(t *testing.T) {
	srv := servertest.Start(t, memkv.New(), servertest.Options{})
	jsonPath := filepath.Join(t.TempDir(), "report.json")
	var stdout, stderr strings.Builder
	code := run([]string{"bench", "--endpoints=" + srv.Endpoint, "--workloads=create,get", "--clients=4", "--connections=2",
		"--data-set=50", "--duration=200ms", "--json=" + jsonPath}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "create") || !strings.Contains(stdout.String(), "p99 ms") {
		t.Errorf("table:\n%s", stdout.String())
	}
	// stderr is not a terminal here: no progress line.
	if stderr.Len() != 0 {
		t.Errorf("unexpected stderr:\n%s", stderr.String())
	}
	rep, err := result.ReadJSON(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2 || rep.Results[0].Workload != "create" || rep.Results[0].Ops == 0 || rep.Params.Clients != 4 {
		t.Errorf("report: %+v", rep)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--workloads=nope"},
		{"bench", "--cert=a.pem"},
		{"bench", "--no-such-flag"},
		{"bench", "extra"},
	} {
		var stdout, stderr strings.Builder
		if code := run(args, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	var stdout, stderr strings.Builder
	if code := run([]string{"bench", "--help"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "--clients") {
		t.Errorf("--help: exit %d, output %q", code, stderr.String())
	}
}
