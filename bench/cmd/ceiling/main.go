// Command ceiling serves bench/ceiling's storage-free etcd API on one TCP
// address, so `make bench` can measure the most any store could do on this
// machine. It owns flag parsing, the listener and signal handling only.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/engramkv/engram/bench/ceiling"
)

func main() {
	if err := run(); err != nil {
		slog.Error("ceiling", "err", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		listen    = flag.String("listen", "127.0.0.1:2379", "host:port to serve the etcd v3 API on (port 0 picks one)")
		pprofAddr = flag.String("pprof", "", "host:port to serve Go's profiles on (/debug/pprof/), to compare the ceiling's per-request work with a store's")
		gcPercent = flag.Int("gc-percent", 1000, "the collector's GOGC (the GOGC environment variable wins)")
		opts      ceiling.Options
	)
	flag.IntVar(&opts.ValueSize, "value-size", 512, "size of every value returned")
	flag.IntVar(&opts.ListKeys, "list-keys", 10_000, "keys a paginated range pretends to hold (match engram bench --data-set)")
	flag.Parse()

	// A store's live heap is hundreds of MiB (caches, engine tables), so at
	// the default GOGC=100 its collector runs every few hundred MiB
	// allocated. The ceiling's live heap is a few MiB: at GOGC=100 it
	// collected every few MiB, and under the get workload 30% of its CPU
	// went to GC assists and to regrowing the worker stacks each
	// collection shrank, so Engram out-ran the bound by 1.3x. GOGC=1000
	// makes its collections as rare as a store's (measured: gets 21k/s ->
	// 34k/s, Engram on badger 33k/s in the same run; 80 MiB resident).
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(*gcPercent)
	}

	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// The transport settings etcd and Engram use, so the ceiling is not
	// faster for a reason a store could not share.
	gs := grpc.NewServer(
		grpc.MaxRecvMsgSize(2<<20),
		grpc.MaxSendMsgSize(math.MaxInt32),
		grpc.MaxConcurrentStreams(math.MaxUint32),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Engram serves calls on a pool of stream workers (core/server);
		// the ceiling gets the same, so it stays the bound.
		grpc.NumStreamWorkers(256),
	)
	ceiling.New(opts).Register(gs)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		gs.Stop()
	}()
	if *pprofAddr != "" {
		pl, err := net.Listen("tcp", *pprofAddr)
		if err != nil {
			return fmt.Errorf("pprof listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		go func() { _ = http.Serve(pl, mux) }()
	}
	slog.Info("ceiling serving", "addr", l.Addr().String())
	if err := gs.Serve(l); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
