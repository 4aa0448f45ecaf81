package workload_test

import (
	"context"
	"testing"
	"time"

	"github.com/engramkv/engram/bench/workload"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
)

// TestChurnAgainstEngram runs a short churn with a fast compactor: updates
// happen without errors, the per-second series covers the run, and the
// compactor compacted at increasing revisions one round behind.
func TestChurnAgainstEngram(t *testing.T) {
	srv := servertest.Start(t, memkv.New(), servertest.Options{})
	cfg := small(srv.Endpoint)
	cfg.Duration = 2500 * time.Millisecond
	cfg.CompactEvery = 400 * time.Millisecond
	cfg.Cleanup = false
	rep, err := workload.Run(context.Background(), cfg, []string{workload.Churn})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	r := byName(t, rep)[workload.Churn]
	if r.Ops == 0 || r.Errors != 0 {
		t.Fatalf("churn: %d ops, %d errors %v", r.Ops, r.Errors, r.ErrorSamples)
	}
	if r.SeriesInterval != 1 || len(r.Series) < 2 || len(r.Series) > 3 {
		t.Errorf("series %v every %v s over %.1f s", r.Series, r.SeriesInterval, r.Seconds)
	}
	if len(r.Compactions) == 0 {
		t.Fatal("no compaction")
	}
	for i, c := range r.Compactions {
		if c.Revision <= 0 || (i > 0 && c.Revision <= r.Compactions[i-1].Revision) {
			t.Errorf("compactions %+v: revisions must grow", r.Compactions)
		}
	}
}

func TestParseWorkloadsChurn(t *testing.T) {
	got, err := workload.ParseWorkloads("churn")
	if err != nil || len(got) != 1 || got[0] != workload.Churn {
		t.Errorf("ParseWorkloads(churn) = %v, %v", got, err)
	}
	all, _ := workload.ParseWorkloads("all")
	for _, w := range all {
		if w == workload.Churn {
			t.Error("all includes churn, a minutes-long workload")
		}
	}
}
