package main

import (
	"strings"
	"testing"

	"github.com/engramkv/engram/bench/result"
)

// TestSQLTargets judges the SQL stores' targets from made-up runs: PostgreSQL
// meets them all, MariaDB misses each one.
func TestSQLTargets(t *testing.T) {
	run := func(rs ...result.Result) []*result.Report { return []*result.Report{{Results: rs}} }
	create := func(tput, p99 float64, errs int64) result.Result {
		r := result.Result{Workload: "create", Throughput: tput, Errors: errs, Unit: "ops/s"}
		r.Latency.P99 = p99
		return r
	}
	h := &harness{
		stores:  []string{storeBadger, storePostgres, storeKinePostgres, storeMySQL, storeKineMySQL},
		skipped: map[string]string{},
		failed:  map[string]string{},
		runs: map[string][]*result.Report{
			storeBadger:       run(create(4000, 50, 0)),
			storePostgres:     run(create(2500, 300, 0)),
			storeKinePostgres: run(create(100, 2000, 3)),
			storeMySQL:        run(create(1500, 800, 2)),
			storeKineMySQL:    run(create(1600, 400, 0)),
		},
		versions: map[string]string{},
	}
	h.failed[storeMySQL] = "repeat 2: out of memory"
	want := map[string]bool{
		"PostgreSQL: creates / Engram on badger": true, "PostgreSQL: create p99": true,
		"PostgreSQL: errors, every workload": true, "PostgreSQL: creates / kine's (the floor)": true,
		"MariaDB: creates / Engram on badger": false, "MariaDB: create p99": false,
		"MariaDB: errors, every workload": false, "MariaDB: creates / kine's (the floor)": false,
	}
	rows := h.sqlTargets()
	if len(rows) != len(want) {
		t.Fatalf("%d target rows, want %d", len(rows), len(want))
	}
	for _, r := range rows {
		ok, listed := want[r.name]
		if !listed || !r.known || r.ok != ok {
			t.Errorf("%s: ok=%v known=%v (%s), want ok=%v", r.name, r.ok, r.known, r.measured, ok)
		}
	}
	var b strings.Builder
	h.writeSQL(&b)
	for _, s := range []string{"### PostgreSQL", "| create | engram-postgres | 2500 ops/s", "| 0.62× | 25.00× |", "**not met**",
		"2; the store failed: repeat 2: out of memory"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("the SQL section lacks %q:\n%s", s, b.String())
		}
	}
}
