// Package result defines what one `engram bench` run reports: the parameters
// it ran with and, per workload, throughput, latency percentiles, failed
// compares and errors. It is the JSON written by `engram bench --json` and
// read back by the make bench harness (bench/harness), so both sides agree
// on one schema.
//
// It owns the schema and its plain-text table rendering only. It must not
// import clients, servers or anything beyond the standard library: the
// harness module imports it without pulling in the load generator.
package result

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is one `engram bench` invocation.
type Report struct {
	// Tool names the generator and its version, e.g. "engram bench v0.1".
	Tool string `json:"tool"`
	// Server is the Status version of the endpoint ("3.6.16", or "" when the
	// endpoint has no Maintenance service).
	Server    string    `json:"server,omitempty"`
	Endpoints []string  `json:"endpoints"`
	Started   time.Time `json:"started"`
	Params    Params    `json:"params"`
	Results   []Result  `json:"results"`
}

// Params are the load generator settings a run used.
type Params struct {
	Clients     int     `json:"clients"`
	Connections int     `json:"connections"`
	KeySize     int     `json:"key_size"`
	ValueSize   int     `json:"value_size"`
	KeyOrder    string  `json:"key_order,omitempty"`
	DataSet     int     `json:"data_set"`
	DeleteKeys  int     `json:"delete_keys"`
	Duration    string  `json:"duration"`
	Rate        float64 `json:"rate"`
	Prefix      string  `json:"prefix"`
	ListLimit   int     `json:"list_limit"`
	ListClients int     `json:"list_clients"`
	ReadRatio   float64 `json:"read_ratio"`
	Watchers    int     `json:"watchers"`
	WatchRate   float64 `json:"watch_rate"`
	LoadBatch   int     `json:"load_batch,omitempty"`
}

// Result is one workload's measurement.
type Result struct {
	Workload string `json:"workload"`
	// Seconds is the measured interval: from the first operation to the
	// end of the last one.
	Seconds float64 `json:"seconds"`
	// Ops counts completed operations (for list: complete paginated lists;
	// for watch: events received), failed compares included, errors not.
	Ops int64 `json:"ops"`
	// Throughput is Ops per second.
	Throughput float64 `json:"throughput"`
	// Unit names what Throughput counts ("ops/s", "lists/s", "events/s").
	Unit string `json:"unit"`
	// FailedCompares are transactions answered Succeeded=false: a normal
	// outcome under contention, not an error.
	FailedCompares int64 `json:"failed_compares"`
	// Errors are failed RPCs and wrong answers (e.g. a list missing keys).
	Errors int64 `json:"errors"`
	// ErrorSamples holds the first few distinct error texts.
	ErrorSamples []string `json:"error_samples,omitempty"`
	// Latency of one operation (list: one full paginated list; watch: from
	// the start of the write to the receipt of its event).
	Latency Latency `json:"latency"`

	// Reads and Writes split a mixed workload's Ops; for load, Writes is
	// the number of objects created.
	Reads  int64 `json:"reads,omitempty"`
	Writes int64 `json:"writes,omitempty"`

	// List workload: pages and keys read, and keys per second. The
	// small-cluster workload reports the pages its lists read, and in Keys
	// and LiveBytes the objects it leaves and the bytes of their keys and
	// values (the least a store must keep).
	Pages      int64   `json:"pages,omitempty"`
	Keys       int64   `json:"keys,omitempty"`
	KeysPerSec float64 `json:"keys_per_sec,omitempty"`
	LiveBytes  int64   `json:"live_bytes,omitempty"`

	// Watch is set for the watch workload.
	Watch *Watch `json:"watch,omitempty"`

	// Series is the churn workload's throughput over time: operations per
	// second in each consecutive interval of SeriesInterval seconds.
	Series         []float64 `json:"series,omitempty"`
	SeriesInterval float64   `json:"series_interval_s,omitempty"`
	// Compactions are the churn's compactions, in order.
	Compactions []Compaction `json:"compactions,omitempty"`
}

// Compaction is one compaction a workload requested.
type Compaction struct {
	Revision int64 `json:"revision"`
	// At is when it was sent, in seconds from the start of the workload;
	// Seconds how long the (non-physical) request took.
	At      float64 `json:"at_s"`
	Seconds float64 `json:"seconds"`
}

// Watch is the delivery account of the watch workload.
type Watch struct {
	Watchers int `json:"watchers"`
	// Writes acknowledged by the server while the watchers were open.
	Writes int64 `json:"writes"`
	// Expected is Writes times Watchers: every watcher must see every write.
	Expected int64 `json:"expected"`
	// Received counts events of acknowledged writes, each counted once per
	// watcher.
	Received int64 `json:"received"`
	// Missing is Expected minus Received: gaps in delivery.
	Missing int64 `json:"missing"`
	// Duplicates are events delivered again to the same watcher, and
	// OutOfOrder events with a revision lower than one already delivered.
	Duplicates int64 `json:"duplicates"`
	OutOfOrder int64 `json:"out_of_order"`
	// WriteRate is acknowledged writes per second.
	WriteRate float64 `json:"write_rate"`
}

// Delivered is the fraction of expected events received, 0..1.
func (w *Watch) Delivered() float64 {
	if w == nil || w.Expected == 0 {
		return 0
	}
	return float64(w.Received) / float64(w.Expected)
}

// Latency percentiles in milliseconds.
type Latency struct {
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

// WriteJSON writes r to path, indented.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// ReadJSON reads a report written by WriteJSON.
func ReadJSON(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read report: %w", err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode report %s: %w", path, err)
	}
	return &r, nil
}

// WriteTable renders the results as an aligned text table.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tthroughput\tunit\tp50 ms\tp90 ms\tp99 ms\tmax ms\tops\tfailed cmp\terrors\t")
	for _, res := range r.Results {
		l := res.Latency
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t\n", res.Workload, Num(res.Throughput), res.Unit,
			Millis(l.P50), Millis(l.P90), Millis(l.P99), Millis(l.Max), res.Ops, res.FailedCompares, res.Errors)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var notes []string
	for _, res := range r.Results {
		if n := res.Note(); n != "" {
			notes = append(notes, res.Workload+": "+n)
		}
		for _, e := range res.ErrorSamples {
			notes = append(notes, res.Workload+" error: "+e)
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, strings.Join(notes, "\n"))
	}
	return nil
}

// Note is a one-line summary of what the table columns do not show.
func (res *Result) Note() string {
	switch {
	case res.Watch != nil:
		wt := res.Watch
		return fmt.Sprintf("%d watchers, %d writes at %s/s, delivered %d/%d events (%.2f%%), missing %d, duplicates %d, out of order %d",
			wt.Watchers, wt.Writes, Num(wt.WriteRate), wt.Received, wt.Expected, 100*wt.Delivered(), wt.Missing, wt.Duplicates, wt.OutOfOrder)
	case res.Keys > 0:
		return fmt.Sprintf("%d pages, %d keys, %s keys/s", res.Pages, res.Keys, Num(res.KeysPerSec))
	case res.Workload == "load":
		return fmt.Sprintf("%d objects created", res.Writes)
	case res.Reads+res.Writes > 0:
		return fmt.Sprintf("%d reads, %d writes", res.Reads, res.Writes)
	}
	return ""
}

// Num formats a rate compactly: 12.3k, 850, 16.2.
func Num(v float64) string {
	switch {
	case v >= 100_000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 10_000:
		return fmt.Sprintf("%.1fk", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.1f", v)
	}
}

// Millis formats milliseconds to three significant figures or fewer: 250,
// 12.5, 1.25.
func Millis(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
