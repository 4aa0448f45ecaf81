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
	"os"
	"os/signal"
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
		listen = flag.String("listen", "127.0.0.1:2379", "host:port to serve the etcd v3 API on (port 0 picks one)")
		opts   ceiling.Options
	)
	flag.IntVar(&opts.ValueSize, "value-size", 512, "size of every value returned")
	flag.IntVar(&opts.ListKeys, "list-keys", 10_000, "keys a paginated range pretends to hold (match engram bench --data-set)")
	flag.Parse()

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
	slog.Info("ceiling serving", "addr", l.Addr().String())
	if err := gs.Serve(l); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
