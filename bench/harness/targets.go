package main

import "fmt"

// churnDegradeFloor is the least share of its first window's throughput
// the churn's last window may keep for "throughput does not degrade": the
// spread between repeats of one workload here is about that size, so a
// smaller drop cannot be told from noise.
const churnDegradeFloor = 0.90

// churnTargets are the rows of the targets table the churn run measures:
// Engram's disk after its own reclamation against the live data, and its
// throughput at the end of the run against the start; etcd's for reference.
func (h *harness) churnTargets() []targetRow {
	c := &h.churn
	if c.duration <= 0 {
		return nil
	}
	r, ok := c.res[storeBadger]
	if !ok || r.Error != "" || r.LiveBytes == 0 {
		return []targetRow{
			{name: "disk after churn / live data", required: "≤ 2×", measured: "–"},
			{name: "churn throughput, last / first window", required: fmt.Sprintf("≥ %.2f", churnDegradeFloor), measured: "–"},
		}
	}
	ref := func(f func(*churnResult) string) string {
		if e, ok := c.res[storeEtcd]; ok && e.Error == "" && e.LiveBytes > 0 {
			return " (etcd " + f(e) + ")"
		}
		return ""
	}
	diskRatio := func(x *churnResult) float64 { return float64(x.AfterReclaim.Total) / float64(x.LiveBytes) }
	rows := []targetRow{{
		name:     fmt.Sprintf("disk after %s churn on %d keys / live data", c.duration, c.keys),
		required: "≤ 2×",
		measured: fmt.Sprintf("%.2f× (%s of %s)", diskRatio(r), mb(r.AfterReclaim.Total), mb(r.LiveBytes)) +
			ref(func(e *churnResult) string { return fmt.Sprintf("%.2f× after defrag", diskRatio(e)) }),
		ok: diskRatio(r) <= 2, known: true,
	}}
	keep := func(x *churnResult) (float64, bool) {
		if x.Result == nil || len(x.Result.Series) == 0 {
			return 0, false
		}
		first, last, _ := firstLast(x.Result)
		if first <= 0 {
			return 0, false
		}
		return last / first, true
	}
	k, known := keep(r)
	_, _, window := firstLast(r.Result)
	rows = append(rows, targetRow{
		name:     fmt.Sprintf("churn throughput, last %s / first %s", window, window),
		required: fmt.Sprintf("≥ %.2f (does not degrade)", churnDegradeFloor),
		measured: fmt.Sprintf("%.2f", k) + ref(func(e *churnResult) string {
			v, _ := keep(e)
			return fmt.Sprintf("%.2f", v)
		}),
		ok: k >= churnDegradeFloor, known: known,
	})
	return rows
}
