// Command harness is `make bench`: it starts the ceiling server, a real etcd
// 3.6 and Engram (badger, pebble, memkv, memkv.wasm; and on PostgreSQL and
// MariaDB beside kine, sql.go) one at a time on 127.0.0.1, runs every
// `engram bench` workload against each with identical parameters, repeats,
// measures server memory after loading N objects, snapshots that loaded
// server with etcdctl and restores the file with the store's own tool, and
// writes BENCHMARKS.md with the medians, ratios and a chart. Optional parts
// add a small cluster's memory and disk (smallcluster.go), cost curves
// over the data size (scale.go) and disk under churn (churn.go).
//
// It owns orchestration and reporting only: the load comes from the engram
// binary's bench subcommand (so every number in the report can be reproduced
// with the command printed next to it), the servers are the built binaries
// run with their defaults. It is a module of its own so that the chart
// library never enters the server's module graph.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/engramkv/engram/bench/result"
)

// params are the load settings passed to every engram bench run.
type params struct {
	clients, connections, keySize, valueSize int
	dataSet, deleteKeys, listClients         int
	watchers                                 int
	watchRate                                float64
	keyOrder                                 string
	duration                                 time.Duration
	repeats, rssObjects, rssBatch            int
}

type harness struct {
	log                                *slog.Logger
	p                                  params
	engramBin, etcdBin, ceilingBin     string
	wasmFile                           string
	workDir                            string
	profileDir                         string
	mode                               string
	stores                             []string
	skipped                            map[string]string // store -> why it has no row
	failed                             map[string]string // store -> the error that stopped its runs
	runs                               map[string][]*result.Report
	commands                           map[string][]string // store -> example commands
	rss                                map[string]rssResult
	snapshot                           bool
	snapSkipped                        string // why no snapshot was measured
	snap                               map[string]snapResult
	etcdctlBin, etcdutlBin             string
	profiles                           map[string]string              // workload -> CPU profile top of engram-badger
	cpu                                map[string]map[string][]cpuUse // store -> workload -> one per repeat
	goBench                            bool
	goBenchOut                         string
	goBenchFlags                       string
	goBenchTook                        time.Duration
	machine                            machine
	versions                           map[string]string
	started                            time.Time
	outMD, outChart, outJSON, repoRoot string
	scale                              scaleRun // cost curves (scale.go)
	churn                              churnConfig
	kineBin, postgresWasm, mysqlWasm   string     // the SQL stores (sql.go)
	sql                                sqlServers // their database servers

	small smallCluster // the small cluster (smallcluster.go)
}

type rssResult struct {
	Objects   int
	Idle      memory
	Loaded    memory
	LoadRate  float64
	LoadError string
}

func main() {
	if err := run(); err != nil {
		slog.Error("bench harness failed", "err", err)
		os.Exit(1)
	}
}

func run() error {
	h := &harness{
		log:      slog.New(slog.NewTextHandler(os.Stderr, nil)),
		skipped:  map[string]string{},
		failed:   map[string]string{},
		runs:     map[string][]*result.Report{},
		commands: map[string][]string{},
		rss:      map[string]rssResult{},
		snap:     map[string]snapResult{},
		cpu:      map[string]map[string][]cpuUse{},
		versions: map[string]string{},
		started:  time.Now(),
	}
	var stores string
	flag.StringVar(&h.engramBin, "engram", "bin/engram", "engram binary (serve and bench)")
	flag.StringVar(&h.etcdBin, "etcd", "bin/etcd", "etcd 3.6 binary")
	flag.StringVar(&h.etcdctlBin, "etcdctl", "bin/etcdctl36", "etcdctl 3.6 binary (snapshot save)")
	flag.StringVar(&h.etcdutlBin, "etcdutl", "bin/etcdutl", "etcdutl 3.6 binary (restoring etcd's snapshot)")
	flag.StringVar(&h.ceilingBin, "ceiling", "bin/engram-ceiling", "ceiling server binary")
	flag.StringVar(&h.wasmFile, "wasm-file", "wasm/testplugins/bin/memkv.wasm", "memkv.wasm plugin for the engram-wasm row (skipped when missing)")
	flag.StringVar(&h.kineBin, "kine", "bin/kine", "kine binary (bench/kine) for the kine-* stores")
	flag.StringVar(&h.postgresWasm, "postgres-wasm", "bin/postgres.wasm", "postgres adaptor for engram-postgres")
	flag.StringVar(&h.mysqlWasm, "mysql-wasm", "bin/mysql.wasm", "mysql adaptor for engram-mysql")
	flag.StringVar(&stores, "stores", strings.Join(append([]string{storeCeiling, storeEtcd, storeBadger, storePebble, storeMemkv, storeWasm}, sqlStores...), ","), "stores to run, in this order")
	flag.StringVar(&h.workDir, "workdir", "", "where servers keep their data (default: a temporary directory, removed afterwards)")
	flag.StringVar(&h.mode, "mode", "make bench", "how this run was invoked, for the report")
	flag.StringVar(&h.outMD, "out", "BENCHMARKS.md", "report to write")
	flag.StringVar(&h.outChart, "chart", "bench/results/chart.png", "chart to write (path relative to the report's directory is used in the report)")
	flag.StringVar(&h.outJSON, "results", "bench/results/results.json", "every run's raw engram bench report, as JSON")
	flag.StringVar(&h.profileDir, "profile-dir", "bench/results", "where to save CPU profiles of engram-badger during each workload of the first repeat (empty: none)")
	flag.BoolVar(&h.goBench, "go-bench", false, "also run `make bench-go` and include its output")
	flag.StringVar(&h.goBenchFlags, "go-bench-flags", "-benchtime=300ms", "BENCH_GO_FLAGS for make bench-go")
	flag.IntVar(&h.p.clients, "clients", 300, "engram bench --clients")
	flag.IntVar(&h.p.connections, "connections", 10, "engram bench --connections")
	flag.IntVar(&h.p.keySize, "key-size", 70, "engram bench --key-size")
	flag.StringVar(&h.p.keyOrder, "key-order", "random", "engram bench --key-order: random (as kube-apiserver's object names arrive) or sequential")
	flag.IntVar(&h.p.valueSize, "value-size", 512, "engram bench --value-size")
	flag.IntVar(&h.p.dataSet, "data-set", 10_000, "engram bench --data-set")
	flag.IntVar(&h.p.deleteKeys, "delete-keys", 100_000, "engram bench --delete-keys")
	flag.IntVar(&h.p.listClients, "list-clients", 10, "engram bench --list-clients")
	flag.IntVar(&h.p.watchers, "watchers", 100, "engram bench --watchers")
	flag.Float64Var(&h.p.watchRate, "watch-rate", 200, "engram bench --watch-rate")
	flag.DurationVar(&h.p.duration, "duration", 5*time.Second, "engram bench --duration")
	flag.IntVar(&h.p.repeats, "repeats", 3, "runs of every workload against every store")
	flag.IntVar(&h.p.rssObjects, "rss-objects", 1_000_000, "objects loaded before measuring server memory (0: skip)")
	flag.BoolVar(&h.snapshot, "snapshot", true, "after loading --rss-objects objects, take `etcdctl snapshot save` of each loaded store and restore the file (etcdutl, engram snapshot restore)")
	flag.IntVar(&h.p.rssBatch, "rss-batch", 10, "objects per create transaction when loading them (engram bench --load-batch)")
	h.registerScaleFlags()
	h.addChurnFlags(flag.CommandLine)
	h.addSmallClusterFlags(flag.CommandLine)
	flag.Parse()
	h.stores = strings.Split(stores, ",")
	h.repoRoot, _ = os.Getwd()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	if h.workDir == "" {
		dir, err := os.MkdirTemp("", "engram-bench")
		if err != nil {
			return fmt.Errorf("work dir: %w", err)
		}
		defer os.RemoveAll(dir)
		h.workDir = dir
	}
	for _, s := range h.stores {
		if _, ok := storeInfo[s]; !ok {
			return fmt.Errorf("unknown store %q", s)
		}
		if s == storeWasm {
			if _, err := os.Stat(h.wasmFile); err != nil {
				h.skipped[s] = fmt.Sprintf("%s is missing (the wasm plugin is not built yet)", h.wasmFile)
			}
		}
	}
	h.checkSQLStores()
	if err := h.startSQL(); err != nil {
		return err
	}
	defer h.sql.stop()
	if h.snapshot && h.p.rssObjects > 0 {
		for _, bin := range []string{h.etcdctlBin, h.etcdutlBin} {
			if _, err := os.Stat(bin); err != nil {
				h.snapSkipped = fmt.Sprintf("%s is missing (make etcd-tools builds it)", bin)
			}
		}
	}
	var err error
	if h.machine, err = probeMachine(h.workDir); err != nil {
		return err
	}
	h.versions["engram"] = versionOf(ctx, h.engramBin, "version")
	h.versions["etcd"] = versionOf(ctx, h.etcdBin, "--version")
	h.versions["go"] = versionOf(ctx, "go", "version")
	h.log.Info("machine", "cpus", h.machine.CPUs, "model", h.machine.CPUModel, "fsync p50", h.machine.FsyncP50, "load", h.machine.LoadBefore)

	if h.goBench {
		if err := h.runGoBench(ctx); err != nil {
			return err
		}
	}
	for rep := range h.p.repeats {
		for _, store := range h.stores {
			if _, skip := h.skipped[store]; skip || h.failed[store] != "" {
				continue
			}
			if err := h.benchStore(ctx, store, rep); err != nil {
				if ctx.Err() != nil {
					return err
				}
				// One store failing (a crash, a refused request) is a
				// result to report, not a reason to lose the others.
				h.log.Error("store failed; no more runs against it", "store", store, "repeat", rep+1, "err", err)
				h.failed[store] = fmt.Sprintf("repeat %d: %v", rep+1, err)
			}
		}
	}
	if h.p.rssObjects > 0 {
		for _, store := range h.stores {
			// The SQL stores are measured on the workloads only: kine
			// cannot load objects in batches, and their memory is mostly
			// the database server's.
			if _, skip := h.skipped[store]; skip || store == storeCeiling || sqlDatabase(store) != "" {
				continue
			}
			if err := h.measureRSS(ctx, store); err != nil {
				if ctx.Err() != nil {
					return err
				}
				h.log.Error("memory measurement failed", "store", store, "err", err)
				h.rss[store] = rssResult{Objects: h.p.rssObjects, LoadError: err.Error()}
			}
		}
	}
	if err := h.runSmallCluster(ctx); err != nil {
		return err
	}
	if err := h.runScale(ctx); err != nil {
		return err
	}
	if err := h.runChurn(ctx); err != nil {
		return err
	}
	h.machine.LoadAfter = loadavg()
	return h.writeReport()
}

// workloadsFor leaves watch out for the ceiling, which delivers no events, and
// gives kine the workloads it accepts (kineWorkloads).
func workloadsFor(store string) string {
	if store == storeCeiling {
		return "create,get,update,list,delete,mixed"
	}
	if isKine(store) {
		return kineWorkloads
	}
	return "all"
}

func (h *harness) benchArgs(endpoint, jsonPath, workloads string) []string {
	p := h.p
	return []string{"bench", "--endpoints=" + endpoint, "--workloads=" + workloads,
		fmt.Sprintf("--clients=%d", p.clients), fmt.Sprintf("--connections=%d", p.connections),
		fmt.Sprintf("--key-size=%d", p.keySize), "--key-order=" + p.keyOrder, fmt.Sprintf("--value-size=%d", p.valueSize),
		fmt.Sprintf("--data-set=%d", p.dataSet), fmt.Sprintf("--delete-keys=%d", p.deleteKeys),
		fmt.Sprintf("--list-clients=%d", p.listClients), fmt.Sprintf("--watchers=%d", p.watchers),
		fmt.Sprintf("--watch-rate=%g", p.watchRate), "--duration=" + p.duration.String(),
		"--json=" + jsonPath, "--quiet"}
}

// runOneWorkload runs engram bench with args, which write its report to
// jsonPath, against srv, and returns the report's first result (nil when it
// has none).
func (h *harness) runOneWorkload(ctx context.Context, srv *server, args []string, jsonPath string) (*result.Result, error) {
	cmd := exec.CommandContext(ctx, h.engramBin, args...)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("engram bench: %w (server log %s:\n%s)", err, srv.log, tail(srv.log))
	}
	r, err := result.ReadJSON(jsonPath)
	if err != nil {
		return nil, err
	}
	if len(r.Results) == 0 {
		return nil, nil
	}
	return &r.Results[0], nil
}

// benchStore runs every workload once against a fresh store.
func (h *harness) benchStore(ctx context.Context, store string, rep int) error {
	dir := filepath.Join(h.workDir, fmt.Sprintf("run%d", rep+1))
	srv, err := h.startStore(ctx, store, dir)
	if err != nil {
		return err
	}
	defer srv.stop()
	jsonPath := filepath.Join(dir, store+".json")
	args := h.benchArgs(srv.endpoint, jsonPath, workloadsFor(store))
	h.log.Info("benchmarking", "store", store, "repeat", rep+1, "endpoint", srv.endpoint)

	// --verbose logs the measured intervals, which the harness reads to
	// profile the server and meter its CPU time.
	args = append(args, "--verbose")
	args = append(args, storeBenchArgs(store)...)
	profile := rep == 0 && store == storeBadger && h.profileDir != ""
	cmd := exec.CommandContext(ctx, h.engramBin, args...)
	cmd.Stdout = io.Discard
	if err := h.runBench(ctx, cmd, store, srv, profile); err != nil {
		return fmt.Errorf("engram bench: %w (server log %s:\n%s)", err, srv.log, tail(srv.log))
	}
	r, err := result.ReadJSON(jsonPath)
	if err != nil {
		return err
	}
	h.runs[store] = append(h.runs[store], r)
	if rep == 0 {
		h.commands[store] = []string{srv.command(), "engram " + strings.Join(args, " ")}
	}
	return nil
}

// measureRSS loads rssObjects objects into a fresh store and reads its
// resident memory, then measures a snapshot of it and its restore.
func (h *harness) measureRSS(ctx context.Context, store string) error {
	dir := filepath.Join(h.workDir, "rss")
	srv, err := h.startStore(ctx, store, dir)
	if err != nil {
		return err
	}
	defer srv.stop()
	res := rssResult{Objects: h.p.rssObjects}
	time.Sleep(time.Second)
	if res.Idle, err = srv.memory(); err != nil {
		return err
	}
	jsonPath := filepath.Join(dir, store+"-load.json")
	args := []string{"bench", "--endpoints=" + srv.endpoint, "--workloads=load", fmt.Sprintf("--data-set=%d", h.p.rssObjects),
		fmt.Sprintf("--load-batch=%d", h.p.rssBatch),
		fmt.Sprintf("--clients=%d", h.p.clients), fmt.Sprintf("--connections=%d", h.p.connections),
		fmt.Sprintf("--key-size=%d", h.p.keySize), "--key-order=" + h.p.keyOrder, fmt.Sprintf("--value-size=%d", h.p.valueSize),
		"--duration=30m", "--json=" + jsonPath, "--quiet"}
	h.log.Info("loading objects for the memory measurement", "store", store, "objects", h.p.rssObjects)
	cmd := exec.CommandContext(ctx, h.engramBin, args...)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Run(); err != nil {
		res.LoadError = err.Error()
	}
	if r, err := result.ReadJSON(jsonPath); err == nil && len(r.Results) > 0 && r.Results[0].Seconds > 0 {
		res.LoadRate = float64(r.Results[0].Writes) / r.Results[0].Seconds
	}
	// Let background work triggered by the load (flushes, compactions)
	// settle before reading the figure that stays.
	time.Sleep(3 * time.Second)
	if res.Loaded, err = srv.memory(); err != nil {
		return err
	}
	if store == storeBadger || store == storePebble {
		h.saveHeapProfile(ctx, srv, fmt.Sprintf("%s-after-%d-objects", store, h.p.rssObjects))
	}
	h.rss[store] = res
	if _, ok := h.commands["load"]; !ok {
		h.commands["load"] = []string{"engram " + strings.Join(args, " ")}
	}
	if h.snapshot && h.snapSkipped == "" {
		if res.LoadError != "" {
			h.snap[store] = snapResult{Objects: h.p.rssObjects, SaveError: "not taken: the load failed"}
		} else {
			h.measureSnapshot(ctx, store, srv)
		}
	}
	return nil
}

// runGoBench runs `make bench-go` and keeps its output for the report.
func (h *harness) runGoBench(ctx context.Context) error {
	h.log.Info("running make bench-go")
	start := time.Now()
	out, err := exec.CommandContext(ctx, "make", "--no-print-directory", "bench-go", "BENCH_GO_FLAGS="+h.goBenchFlags).CombinedOutput()
	h.goBenchTook = time.Since(start)
	h.goBenchOut = string(out)
	if err != nil {
		// A package that does not build is reported, not fatal: the load
		// benchmarks do not depend on it.
		h.goBenchOut += "\n(make bench-go failed: " + err.Error() + ")\n"
	}
	return nil
}
