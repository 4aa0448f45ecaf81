package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/engramkv/engram/bench/workload"
)

// benchMain is `engram bench`: the load generator of bench/workload against
// any etcd v3 endpoint. This file only turns flags into a workload.Config and
// prints the report.
func benchMain(args []string, stdout, stderr io.Writer) int {
	d := workload.Defaults()
	fs := pflag.NewFlagSet("engram bench", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		endpoints = fs.StringSlice("endpoints", d.Endpoints, "etcd v3 endpoints to load (host:port, https://host:port or unix:///path)")
		cacert    = fs.String("cacert", "", "PEM CA bundle that signed the server certificate (enables TLS)")
		cert      = fs.String("cert", "", "PEM client certificate for TLS client authentication")
		key       = fs.String("key", "", "PEM private key of --cert")
		insecure  = fs.Bool("insecure-skip-tls-verify", false, "use TLS without verifying the server certificate")
		names     = fs.String("workloads", "all", "comma-separated workloads: "+strings.Join(workload.All, ", ")+", all, load (create --data-set objects and keep them), churn (updates for --duration with kube-apiserver's compactor, throughput per second), or small-cluster (a small cluster's nodes and pods through their life, left in place)")
		jsonOut   = fs.String("json", "", "also write the report as JSON to this file")
		quiet     = fs.Bool("quiet", false, "no progress line on stderr (it is also off when stderr is not a terminal)")
		verbose   = fs.Bool("verbose", false, "log each phase on stderr")
		cpuProf   = fs.String("cpu-profile", "", "write a CPU profile of the load generator itself to this file (to check it is not the bottleneck)")
	)
	fs.IntVar(&d.Clients, "clients", d.Clients, "concurrent request loops")
	fs.IntVar(&d.Connections, "connections", d.Connections, "gRPC connections, shared round-robin by the clients")
	fs.IntVar(&d.KeySize, "key-size", d.KeySize, "key size in bytes")
	fs.IntVar(&d.ValueSize, "value-size", d.ValueSize, "value size in bytes")
	fs.StringVar(&d.KeyOrder, "key-order", d.KeyOrder, "order of key names: random (as kube-apiserver's object names arrive) or sequential")
	fs.IntVar(&d.DataSet, "data-set", d.DataSet, "keys preloaded for get, update, list and mixed (and created by load)")
	fs.IntVar(&d.DeleteKeys, "delete-keys", d.DeleteKeys, "keys preloaded for delete (the workload ends early when a client has deleted its share)")
	fs.DurationVar(&d.Duration, "duration", d.Duration, "how long each workload runs")
	fs.Float64Var(&d.Rate, "rate", d.Rate, "operations per second over all clients (0: as fast as the server answers)")
	fs.StringVar(&d.Prefix, "prefix", "", "key prefix (default: a unique /bench/<random>/ per run)")
	fs.IntVar(&d.ListLimit, "list-limit", d.ListLimit, "page size of the list workload")
	fs.IntVar(&d.ListClients, "list-clients", d.ListClients, "concurrent full lists in the list workload")
	fs.Float64Var(&d.ReadRatio, "read-ratio", d.ReadRatio, "share of gets in the mixed workload (the rest are updates)")
	fs.IntVar(&d.Watchers, "watchers", d.Watchers, "watches open in the watch workload")
	fs.Float64Var(&d.WatchRate, "watch-rate", d.WatchRate, "writes per second in the watch workload (events delivered per second = this x watchers)")
	fs.DurationVar(&d.WatchDrain, "watch-drain", d.WatchDrain, "how long to wait for outstanding watch events after the last write")
	fs.IntVar(&d.LoadBatch, "load-batch", d.LoadBatch, "objects created per transaction by the load workload (1: one create per object, as kube-apiserver)")
	fs.BoolVar(&d.Cleanup, "cleanup", d.Cleanup, "delete each workload's keys afterwards and compact")
	fs.DurationVar(&d.CompactEvery, "compact-every", d.CompactEvery, "churn: compact as kube-apiserver's compactor does at this interval, to the revision of the previous round (0: never)")
	fs.IntVar(&d.LoadFrom, "load-from", 0, "index of the first object load creates, to grow a store in steps (objects load-from..data-set-1)")
	fs.IntVar(&d.PrefixObjects, "prefix-objects", 0, "spread load's objects over sub-prefixes <prefix>NNN/ of this many each (0: one prefix)")
	fs.BoolVar(&d.Existing, "existing", false, "get and list read the objects load created under --prefix (get: --data-set of them; list: the first sub-prefix, --data-set keys) instead of preloading their own")
	fs.IntVar(&d.ClusterPods, "cluster-pods", d.ClusterPods, "small-cluster: pods created (and one in five deleted and replaced)")
	fs.IntVar(&d.ClusterNodes, "cluster-nodes", d.ClusterNodes, "small-cluster: nodes, each with its heartbeat lease")
	fs.DurationVar(&d.DialTimeout, "dial-timeout", d.DialTimeout, "how long to wait for the endpoint")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: engram bench [flags]")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Loads an etcd v3 endpoint with kube-apiserver-shaped requests and reports")
		fmt.Fprintln(stderr, "throughput and latency per workload. Flags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "engram bench: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	list, err := workload.ParseWorkloads(*names)
	if err != nil {
		fmt.Fprintf(stderr, "engram bench: %v\n", err)
		return 2
	}
	d.Endpoints = *endpoints
	d.Tool = "engram bench " + buildVersion()
	if d.TLS, err = clientTLS(*cacert, *cert, *key, *insecure); err != nil {
		fmt.Fprintf(stderr, "engram bench: %v\n", err)
		return 2
	}
	if !*quiet && isTerminal(os.Stderr) {
		d.Progress = stderr
	}
	if *verbose {
		d.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	}

	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			fmt.Fprintf(stderr, "engram bench: --cpu-profile: %v\n", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "engram bench: --cpu-profile: %v\n", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	rep, runErr := workload.Run(ctx, d, list)
	if rep != nil {
		fmt.Fprintf(stdout, "endpoints %s (server %s), prefix %s, %d clients over %d connections, %d-byte keys in %s order, %d-byte values, %s per workload\n\n",
			strings.Join(rep.Endpoints, ","), orUnknown(rep.Server), rep.Params.Prefix, d.Clients, d.Connections, d.KeySize, d.KeyOrder, d.ValueSize, d.Duration)
		if err := rep.WriteTable(stdout); err != nil {
			fmt.Fprintf(stderr, "engram bench: %v\n", err)
			return 1
		}
		if *jsonOut != "" {
			if err := rep.WriteJSON(*jsonOut); err != nil {
				fmt.Fprintf(stderr, "engram bench: %v\n", err)
				return 1
			}
		}
	}
	if runErr != nil {
		fmt.Fprintf(stderr, "engram bench: %v\n", runErr)
		return 1
	}
	return 0
}

func orUnknown(s string) string {
	if s == "" {
		return "version unknown"
	}
	return s
}

// clientTLS builds the client TLS config from etcdctl-style flags; nil means
// plaintext.
func clientTLS(cacert, cert, key string, insecure bool) (*tls.Config, error) {
	if cacert == "" && cert == "" && key == "" && !insecure {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: insecure}
	if cacert != "" {
		pem, err := os.ReadFile(cacert)
		if err != nil {
			return nil, fmt.Errorf("--cacert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--cacert %s: no PEM certificate found", cacert)
		}
		cfg.RootCAs = pool
	}
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("--cert and --key go together")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("--cert/--key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// isTerminal reports whether f is a terminal (not merely a character
// device: /dev/null is one too).
func isTerminal(f *os.File) bool {
	return term.IsTerminal(int(f.Fd()))
}
