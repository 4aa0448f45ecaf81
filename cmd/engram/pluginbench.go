package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/engramkv/engram/bench/kvbench"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/wasm/abi"
	"github.com/engramkv/engram/wasm/host"
)

// benchReport is what `engram plugin bench --json` writes.
type benchReport struct {
	File    string           `json:"file"`
	SHA256  string           `json:"sha256"`
	Engine  string           `json:"engine"`
	Version string           `json:"version"`
	Model   string           `json:"model"`
	Config  kvbench.Config   `json:"config"`
	Plugin  []kvbench.Result `json:"plugin"`
	Native  []kvbench.Result `json:"native_memkv"`
}

// pluginBench is `engram plugin bench FILE`: kvbench against the plugin
// through the host, then against the native memkv with the same keys, side
// by side. The plugin's store gets {{case}} replaced by a name of its own,
// and the keys are deleted afterwards, so a database table is left as found.
func pluginBench(ctx context.Context, file string, opts host.Options, sopts host.StoreOptions, cfg kvbench.Config,
	ops []string, jsonOut string, stdout, stderr io.Writer) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(stderr, "engram plugin bench: "+format+"\n", args...)
		return 1
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "engram plugin bench: %v\n", err)
		return 2
	}
	p, err := host.Load(ctx, file, opts)
	if err != nil {
		return fail("%v", err)
	}
	defer p.Close(context.Background())
	sopts.Config = []byte(strings.ReplaceAll(string(sopts.Config), caseToken, fmt.Sprintf("engram_bench_%d", time.Now().Unix())))
	st, err := p.Open(ctx, sopts)
	if err != nil {
		return fail("%v", err)
	}
	defer st.Close()
	m := st.Manifest()
	cfg.LoadBatch = loadBatch(cfg, m)
	pool := 1
	if m.Model == abi.ModelPooled {
		pool = sopts.PoolSize
		if m.MaxInstances > 0 {
			pool = min(pool, int(m.MaxInstances))
		}
	}
	fmt.Fprintf(stdout, "Benchmarking %s (sha256 %s)\nengine %s %s, instance model %v (%d instance(s)), %d client(s)\n",
		filepath.Base(file), p.Digest(), m.Name, m.Version, m.Model, pool, cfg.Clients)
	fmt.Fprintf(stdout, "%d keys of %d bytes in random order, values of %d bytes, scans of %d pairs, commits of 3 ops (CAS, PutIfAbsent, Put), %s per operation\n\n",
		cfg.Keys, cfg.KeySize, cfg.ValueSize, cfg.ScanLength, cfg.Duration)

	plugin, err := kvbench.Run(ctx, st, cfg, ops)
	if cerr := kvbench.Cleanup(context.Background(), st, cfg.LoadBatch); cerr != nil {
		fmt.Fprintf(stderr, "engram plugin bench: deleting the bench's keys from the plugin's store: %v\n", cerr)
	}
	if err != nil {
		return fail("%s: %v", filepath.Base(file), err)
	}
	native := memkv.New()
	defer native.Close()
	base, err := kvbench.Run(ctx, native, cfg, ops)
	if err != nil {
		return fail("native memkv: %v", err)
	}
	printBench(stdout, filepath.Base(file), plugin, base)
	if jsonOut != "" {
		rep := benchReport{File: file, SHA256: p.Digest(), Engine: m.Name, Version: m.Version, Model: m.Model.String(),
			Config: cfg, Plugin: plugin, Native: base}
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(jsonOut, append(b, '\n'), 0o644); err != nil {
			return fail("--json: %v", err)
		}
	}
	failed := false
	for _, r := range plugin {
		if r.Errors > 0 {
			failed = true
			fmt.Fprintf(stderr, "engram plugin bench: %s: %d of %d calls failed; first: %s\n", r.Op, r.Errors, r.Errors+r.Calls, r.FirstError)
		}
	}
	if failed {
		return 1
	}
	return 0
}

// loadBatch keeps the load's commits within the plugin's declared limits.
func loadBatch(cfg kvbench.Config, m abi.Manifest) int {
	n := cfg.LoadBatch
	if m.MaxCommitOps > 0 {
		n = min(n, int(m.MaxCommitOps))
	}
	if m.MaxCommitBytes > 0 {
		// An encoded put is its two lengths (at most 3 bytes each at
		// these sizes), the kind byte, the key and the value.
		per := cfg.KeySize + cfg.ValueSize + 8
		n = min(n, max(int(m.MaxCommitBytes)/per, 1))
	}
	return max(n, 1)
}

func printBench(w io.Writer, name string, plugin, native []kvbench.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "op\tstore\tcalls/s\tp50\tp99\tmean\tp50 / native\t")
	for i, r := range plugin {
		ratio := "-"
		if i < len(native) && native[i].P50 > 0 && r.P50 > 0 {
			ratio = fmt.Sprintf("%.1fx", float64(r.P50)/float64(native[i].P50))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Op, name, rate(r.PerSecond), dur(r.P50), dur(r.P99), dur(r.Mean), ratio)
		if i < len(native) {
			n := native[i]
			fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\t%s\t\t\n", "native memkv", rate(n.PerSecond), dur(n.P50), dur(n.P99), dur(n.Mean))
		}
	}
	_ = tw.Flush()
}

func rate(v float64) string {
	switch {
	case v >= 10_000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.1fk", v/1000)
	}
	return fmt.Sprintf("%.0f", v)
}

// dur prints a latency with three significant digits in µs or ms.
func dur(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%.3gµs", float64(d)/float64(time.Microsecond))
	}
	return fmt.Sprintf("%.3gms", float64(d)/float64(time.Millisecond))
}
