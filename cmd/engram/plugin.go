package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/engramkv/engram/bench/kvbench"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvtest"
	"github.com/engramkv/engram/wasm/abi"
	"github.com/engramkv/engram/wasm/host"
)

// caseToken is replaced in --config by a value unique to each conformance
// case, so a plugin backed by a remote store can give every case a fresh,
// empty namespace (a table, a key prefix).
const caseToken = "{{case}}"

// pluginMain is `engram plugin info|verify FILE.wasm [flags]`.
func pluginMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		pluginUsage(stdout)
		return 0
	}
	sub, rest := args[0], args[1:]
	fs := pflag.NewFlagSet("engram plugin "+sub, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	config := fs.String("config", "", "configuration string passed to the plugin's init; in verify and bench, "+caseToken+" is replaced by a name unique to each case (or run)")
	allowed := fs.StringSlice("allowed-addresses", nil, "host:port addresses the plugin may connect to")
	memLimit := fs.Int64("memory-limit", host.DefaultMemoryLimit, "linear memory cap per instance, in bytes")
	poolSize := fs.Int("pool-size", 2, "instances of a pooled plugin")
	cacheDir := fs.String("cache-dir", "", "compilation cache directory (default: a cache under the user cache directory)")
	untrusted := fs.Bool("untrusted", false, "compile with interruption checks (stops spinning plugins; slower)")
	callTimeout := fs.Duration("call-timeout", 30*time.Second, "upper bound of one plugin call")
	run := fs.String("run", "", "verify: run only the cases whose name matches this regular expression")
	caseTimeout := fs.Duration("case-timeout", time.Minute, "verify: bound of one case")
	verbose := fs.BoolP("verbose", "v", false, "log the host's and the plugin's messages to stderr")
	pin := fs.String("sha256", "", "refuse a FILE whose SHA-256 differs from this (as storage.wasm.sha256 does)")
	bcfg := kvbench.Defaults()
	fs.IntVar(&bcfg.Keys, "keys", bcfg.Keys, "bench: keys loaded before measuring")
	fs.IntVar(&bcfg.KeySize, "key-size", bcfg.KeySize, "bench: key size in bytes")
	fs.IntVar(&bcfg.ValueSize, "value-size", bcfg.ValueSize, "bench: value size in bytes")
	fs.IntVar(&bcfg.ScanLength, "scan-length", bcfg.ScanLength, "bench: pairs read by one scan")
	fs.DurationVar(&bcfg.Duration, "duration", bcfg.Duration, "bench: how long each operation is measured")
	fs.IntVar(&bcfg.Clients, "clients", bcfg.Clients, "bench: concurrent callers (1 measures the cost of one call)")
	benchOps := fs.StringSlice("ops", kvbench.Ops, "bench: operations to measure")
	jsonOut := fs.String("json", "", "bench: also write the results as JSON to this file")
	if err := fs.Parse(rest); err != nil {
		fmt.Fprintf(stderr, "engram plugin %s: %v\n\n", sub, err)
		pluginUsage(stderr)
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "engram plugin %s: want exactly one FILE.wasm argument\n\n", sub)
		pluginUsage(stderr)
		return 2
	}
	file := fs.Arg(0)
	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if *cacheDir == "" {
		if d, err := os.UserCacheDir(); err == nil {
			*cacheDir = filepath.Join(d, "engram", "wasm-cache")
		}
	}
	opts := host.Options{Logger: logger, CacheDir: *cacheDir, MemoryLimit: *memLimit, Untrusted: *untrusted, SHA256: *pin}
	sopts := host.StoreOptions{Config: []byte(*config), PoolSize: *poolSize, AllowedAddresses: *allowed, CallTimeout: *callTimeout}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	switch sub {
	case "info":
		return pluginInfo(ctx, file, opts, sopts, stdout, stderr)
	case "verify":
		var re *regexp.Regexp
		if *run != "" {
			var err error
			if re, err = regexp.Compile(*run); err != nil {
				fmt.Fprintf(stderr, "engram plugin verify: --run: %v\n", err)
				return 2
			}
		}
		return pluginVerify(ctx, file, opts, sopts, re, *caseTimeout, stdout, stderr)
	case "bench":
		return pluginBench(ctx, file, opts, sopts, bcfg, *benchOps, *jsonOut, stdout, stderr)
	}
	fmt.Fprintf(stderr, "engram plugin: unknown subcommand %q\n\n", sub)
	pluginUsage(stderr)
	return 2
}

func pluginUsage(w io.Writer) {
	fmt.Fprint(w, `Usage:
  engram plugin info FILE.wasm [flags]     print the plugin's manifest
  engram plugin verify FILE.wasm [flags]   run the adaptor conformance suite against the plugin
  engram plugin bench FILE.wasm [flags]    measure Get, Scan and Commit through the host,
                                           beside Engram's native in-memory engine

Flags:
  --config STRING             configuration passed to the plugin's init; in verify and
                              bench, {{case}} is replaced by a name unique to each case
                              (verify) or run (bench)
  --allowed-addresses LIST    host:port addresses the plugin may connect to
  --pool-size N               instances of a pooled plugin (default 2)
  --memory-limit BYTES        linear memory cap per instance (default 256 MiB)
  --call-timeout DURATION     upper bound of one plugin call (default 30s)
  --untrusted                 make a spinning plugin interruptible (slower)
  --cache-dir DIR             compilation cache (default under the user cache dir)
  --sha256 HEX                refuse FILE unless its SHA-256 is HEX (as storage.wasm.sha256)
  --run REGEXP                verify: only the cases whose name matches
  --case-timeout DURATION     verify: bound of one case (default 1m)
  --keys N                    bench: keys loaded before measuring (default 10000)
  --key-size BYTES            bench: key size (default 70)
  --value-size BYTES          bench: value size (default 512)
  --scan-length N             bench: pairs one scan reads (default 100)
  --duration DURATION         bench: time per operation (default 2s)
  --clients N                 bench: concurrent callers (default 1: the cost of one call)
  --ops LIST                  bench: operations, of get,scan,commit (default all)
  --json FILE                 bench: also write the results as JSON
  -v, --verbose               log the host's and the plugin's messages

verify exits with status 1 if any case fails; bench with status 1 if any
call fails.
`)
}

func pluginInfo(ctx context.Context, file string, opts host.Options, sopts host.StoreOptions, stdout, stderr io.Writer) int {
	p, err := host.Load(ctx, file, opts)
	if err != nil {
		fmt.Fprintf(stderr, "engram plugin info: %v\n", err)
		return 1
	}
	defer p.Close(context.Background())
	sopts.PoolSize = 1
	s, err := p.Open(ctx, sopts)
	if err != nil {
		fmt.Fprintf(stderr, "engram plugin info: %v\n", err)
		return 1
	}
	m := s.Manifest()
	f := s.Features()
	_ = s.Close()
	size := int64(0)
	if st, err := os.Stat(file); err == nil {
		size = st.Size()
	}
	model := "single: the data lives in the plugin's memory; one instance, lost if it crashes"
	if m.Model == abi.ModelPooled {
		model = "pooled: a stateless client of a remote store; storage.wasm.pool-size instances"
	}
	var ops []string
	for op := abi.OpInit; op <= abi.MaxOp; op++ {
		if m.Supports(op) {
			ops = append(ops, op.String())
		}
	}
	var feats []string
	if f.Partitions {
		feats = append(feats, "partitions")
	}
	if f.Durable {
		feats = append(feats, "durable")
	}
	if f.NativeTTL {
		feats = append(feats, "native-ttl")
	}
	if len(feats) == 0 {
		feats = []string{"none"}
	}
	limit := func(v uint32) string {
		if v == 0 {
			return "none"
		}
		return fmt.Sprint(v)
	}
	fmt.Fprintf(stdout, "file:            %s (%d bytes)\n", file, size)
	fmt.Fprintf(stdout, "sha256:          %s\n", p.Digest())
	fmt.Fprintf(stdout, "name:            %s\n", m.Name)
	fmt.Fprintf(stdout, "version:         %s\n", m.Version)
	fmt.Fprintf(stdout, "abi:             %d.%d (host: %d.%d)\n", abi.Major, m.ABIMinor, abi.Major, abi.Minor)
	fmt.Fprintf(stdout, "instance model:  %s\n", model)
	fmt.Fprintf(stdout, "max instances:   %s\n", limit(m.MaxInstances))
	fmt.Fprintf(stdout, "ops:             %s\n", strings.Join(ops, " "))
	fmt.Fprintf(stdout, "features:        %s\n", strings.Join(feats, " "))
	fmt.Fprintf(stdout, "max commit ops:  %s\n", limit(m.MaxCommitOps))
	fmt.Fprintf(stdout, "max commit size: %s\n", limit(m.MaxCommitBytes))
	fmt.Fprintf(stdout, "max scan batch:  %s\n", limit(m.MaxScanBatch))
	return 0
}

func pluginVerify(ctx context.Context, file string, opts host.Options, sopts host.StoreOptions, re *regexp.Regexp, caseTimeout time.Duration, stdout, stderr io.Writer) int {
	p, err := host.Load(ctx, file, opts)
	if err != nil {
		fmt.Fprintf(stderr, "engram plugin verify: %v\n", err)
		return 1
	}
	defer p.Close(context.Background())
	cfg := kvtest.Config{CaseTimeout: caseTimeout}
	var cases []kvtest.Case
	for _, c := range kvtest.Cases(cfg) {
		if re == nil || re.MatchString(c.Name) {
			cases = append(cases, c)
		}
	}
	if len(cases) == 0 {
		fmt.Fprintln(stderr, "engram plugin verify: --run matches no case")
		return 2
	}
	runID := time.Now().Unix()
	n := 0
	open := func(ctx context.Context) (kv.Store, error) {
		n++
		o := sopts
		o.Config = []byte(strings.ReplaceAll(string(sopts.Config), caseToken, fmt.Sprintf("engram_verify_%d_%d", runID, n)))
		return p.Open(ctx, o)
	}
	// One store up front names the plugin in the report and fails fast on
	// a configuration the plugin refuses.
	first, err := p.Open(ctx, host.StoreOptions{Config: []byte(strings.ReplaceAll(string(sopts.Config), caseToken, fmt.Sprintf("engram_verify_%d_0", runID))),
		PoolSize: 1, AllowedAddresses: sopts.AllowedAddresses, CallTimeout: sopts.CallTimeout})
	if err != nil {
		fmt.Fprintf(stderr, "engram plugin verify: %v\n", err)
		return 1
	}
	m := first.Manifest()
	_ = first.Close()
	fmt.Fprintf(stdout, "Verifying %s: engine %s %s, ABI %d.%d, instance model %v, %d cases\n",
		filepath.Base(file), m.Name, m.Version, abi.Major, m.ABIMinor, m.Model, len(cases))
	fmt.Fprintf(stdout, "Optional ops: %s\n\n", optionalOps(&m))
	start := time.Now()
	passed, skipped, failed := 0, 0, 0
	for _, c := range cases {
		if ctx.Err() != nil {
			break
		}
		r := kvtest.VerifyCases(ctx, cfg, []kvtest.Case{c}, open)[0]
		mark := "PASS"
		switch {
		case r.Skipped:
			skipped++
			mark = "SKIP"
		case r.Passed:
			passed++
		default:
			failed++
			mark = "FAIL"
		}
		fmt.Fprintf(stdout, "%s  %-28s %8s\n", mark, r.Name, r.Duration.Round(time.Millisecond))
		// A skipped case says why: the optional op it checks is not
		// declared.
		if !r.Passed || r.Skipped {
			for _, msg := range r.Messages {
				for _, line := range strings.Split(msg, "\n") {
					fmt.Fprintf(stdout, "      %s\n", line)
				}
			}
		}
	}
	fmt.Fprintf(stdout, "\n%d passed, %d skipped, %d failed (%s)\n", passed, skipped, failed, time.Since(start).Round(time.Millisecond))
	if err := ctx.Err(); err != nil {
		fmt.Fprintf(stderr, "engram plugin verify: interrupted: %v\n", err)
		return 1
	}
	if failed > 0 {
		fmt.Fprintln(stdout, "The contract each case checks is documented in core/kv (package kv) and wasm/abi/ABI.md, section 6.")
		return 1
	}
	return 0
}

// optionalOps says which of the ops the conformance suite checks only where
// declared (SIZE: case Size, RECLAIM: case Reclaim) the plugin declares.
func optionalOps(m *abi.Manifest) string {
	var parts []string
	for _, o := range []struct {
		op   abi.Op
		name string
	}{{abi.OpSize, "Size"}, {abi.OpReclaim, "Reclaim"}} {
		if m.Supports(o.op) {
			parts = append(parts, fmt.Sprintf("%v declared, checked by case %s", o.op, o.name))
		} else {
			parts = append(parts, fmt.Sprintf("%v not declared, case %s skipped", o.op, o.name))
		}
	}
	return strings.Join(parts, "; ")
}
