package server_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/engines/badger"
)

// BenchmarkRangeStreamMemory measures the server's memory while a client
// reads a list of 100,000 keys with 1 KiB values (random names, as
// kube-apiserver's objects arrive) three ways: through RangeStream, through
// paginated Range (pages of 500 pinned to the first page's revision, as
// kube-apiserver pages) and through one unpaginated Range.
//
// The server runs on badger in a child process (this test binary started
// again with memServerEnv set), so the client's memory, which for the
// unpaginated Range holds the whole answer too, is not counted. Before each
// read the child collects garbage and takes its heap as the base; during
// the read it samples every millisecond two runtime/metrics values: the
// heap's objects (live and garbage not yet collected, so with the default
// GOGC up to about twice the live heap) and the live heap as the last
// garbage collection marked it. A fresh child serves each way of reading,
// so its peak RSS (VmHWM) belongs to that way alone. Reported per way
// (the largest over the iterations; the base of the first): base heap,
// peak heap and its growth over base, peak live heap's growth over the
// base, collections during the read, and the child's peak RSS.
func BenchmarkRangeStreamMemory(b *testing.B) {
	dir := b.TempDir()
	const keys, valueBytes = 100_000, 1 << 10
	loader := startMemServer(b, dir)
	loader.load(b, keys, valueBytes)
	loader.stop(b)
	for _, way := range []struct {
		name string
		read func(b *testing.B, kv pb.KVClient) int
	}{
		{"stream", readStream},
		{"paginated-500", readPaginated},
		{"unpaginated", readUnpaginated},
	} {
		b.Run(way.name, func(b *testing.B) {
			s := startMemServer(b, dir)
			defer s.stop(b)
			const mib = 1 << 20
			var base, peak, growth, liveGrowth, gcs float64
			for b.Loop() {
				bs := s.command(b, "reset")
				if n := way.read(b, s.kv); n != keys {
					b.Fatalf("read %d keys, want %d", n, keys)
				}
				r := s.command(b, "report")
				if base == 0 {
					base = float64(bs[0]) / mib
				}
				peak = max(peak, float64(r[0])/mib)
				growth = max(growth, float64(r[0]-bs[0])/mib)
				liveGrowth = max(liveGrowth, float64(r[1]-bs[1])/mib)
				gcs = max(gcs, float64(r[2]-bs[2]))
			}
			rss := s.command(b, "rss")
			b.ReportMetric(base, "base-heap-MiB")
			b.ReportMetric(peak, "peak-heap-MiB")
			b.ReportMetric(growth, "heap-growth-MiB")
			b.ReportMetric(liveGrowth, "live-growth-MiB")
			b.ReportMetric(gcs, "gcs")
			b.ReportMetric(float64(rss[0])/mib, "peak-rss-MiB")
		})
	}
}

func readStream(b *testing.B, kv pb.KVClient) int {
	s, err := kv.RangeStream(context.Background(), &pb.RangeRequest{Key: []byte("/registry/"), RangeEnd: []byte("/registry0")})
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for {
		m, err := s.Recv()
		if err == io.EOF {
			return n
		}
		if err != nil {
			b.Fatal(err)
		}
		n += len(m.RangeResponse.Kvs)
	}
}

func readPaginated(b *testing.B, kv pb.KVClient) int {
	req := &pb.RangeRequest{Key: []byte("/registry/"), RangeEnd: []byte("/registry0"), Limit: 500}
	n := 0
	for {
		r, err := kv.Range(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		n += len(r.Kvs)
		if !r.More {
			return n
		}
		req.Revision = r.Header.Revision
		req.Key = append(bytes.Clone(r.Kvs[len(r.Kvs)-1].Key), 0)
	}
}

func readUnpaginated(b *testing.B, kv pb.KVClient) int {
	r, err := kv.Range(context.Background(), &pb.RangeRequest{Key: []byte("/registry/"), RangeEnd: []byte("/registry0")}, grpc.MaxCallRecvMsgSize(1<<30))
	if err != nil {
		b.Fatal(err)
	}
	return len(r.Kvs)
}

// memServerEnv, set to a data directory, makes this test binary the
// benchmark's server instead of running tests.
const memServerEnv = "ENGRAM_RANGESTREAM_MEM_SERVER"

func init() {
	if dir := os.Getenv(memServerEnv); dir != "" {
		if err := memServerMain(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// memServer is the child process as the benchmark drives it.
type memServer struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	conn *grpc.ClientConn
	kv   pb.KVClient
}

func startMemServer(b *testing.B, dir string) *memServer {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memServerEnv+"="+dir)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	s := &memServer{cmd: cmd, in: in, out: bufio.NewReader(outPipe)}
	line, err := s.out.ReadString('\n')
	if err != nil {
		b.Fatalf("benchmark server: %v", err)
	}
	s.conn, err = grpc.NewClient(strings.TrimSpace(line), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	s.kv = pb.NewKVClient(s.conn)
	return s
}

// command sends one command line to the child and returns the numbers it
// answers.
func (s *memServer) command(b *testing.B, c string) []int64 {
	b.Helper()
	if _, err := fmt.Fprintln(s.in, c); err != nil {
		b.Fatal(err)
	}
	line, err := s.out.ReadString('\n')
	if err != nil {
		b.Fatalf("benchmark server, %s: %v", c, err)
	}
	var nums []int64
	for _, f := range strings.Fields(line) {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("benchmark server, %s: %q", c, line)
		}
		nums = append(nums, n)
	}
	return nums
}

// stop closes the child's stdin, which shuts it down, and waits for it.
func (s *memServer) stop(b *testing.B) {
	b.Helper()
	_ = s.conn.Close()
	_ = s.in.Close()
	if err := s.cmd.Wait(); err != nil {
		b.Errorf("benchmark server: %v", err)
	}
}

// load writes n keys with random names and random (incompressible) values
// of size bytes, 100 to a transaction.
func (s *memServer) load(b *testing.B, n, size int) {
	b.Helper()
	for i := 0; i < n; i += 100 {
		var ops []*pb.RequestOp
		for range min(100, n-i) {
			v := make([]byte, size)
			_, _ = rand.Read(v)
			key := fmt.Sprintf("/registry/pods/ns-%d/pod-%x", i%50, v[:8])
			ops = append(ops, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: v}}})
		}
		if _, err := s.kv.Txn(context.Background(), &pb.TxnRequest{Success: ops}); err != nil {
			b.Fatal(err)
		}
	}
}

// memServerMain serves Engram on badger in dir on 127.0.0.1, prints the
// endpoint, and answers commands on stdin until it closes: "reset" (collect
// garbage, take the heap as base and peak; answers the heap, the live heap
// and the number of collections), "report" (the peak heap and peak live
// heap since reset and the number of collections) and "rss" (peak and
// current RSS of the process).
func memServerMain(dir string) error {
	st, err := badger.Open(badger.Options{Dir: dir})
	if err != nil {
		return err
	}
	defer st.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	opts := server.Options{Store: st, Logger: slog.New(slog.DiscardHandler), Name: "rangestream-mem",
		AdvertiseClientURLs: []string{"http://" + l.Addr().String()}}
	srv, err := server.New(context.Background(), opts)
	if err != nil {
		return err
	}
	gs := grpc.NewServer(append(server.GRPCServerOptions(opts, nil), srv.Interceptors()...)...)
	srv.Register(gs)
	go func() { _ = gs.Serve(l) }()

	var peak, peakLive atomic.Int64
	samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/live:bytes"}, {Name: "/gc/cycles/total:gc-cycles"}}
	read := func() (heap, live, gcs int64) {
		metrics.Read(samples)
		return int64(samples[0].Value.Uint64()), int64(samples[1].Value.Uint64()), int64(samples[2].Value.Uint64())
	}
	done := make(chan struct{})
	go func() {
		// Sampling is the only way to see the heap's peak between two
		// commands; a millisecond is far below a read's duration.
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				h, l, _ := read()
				if h > peak.Load() {
					peak.Store(h)
				}
				if l > peakLive.Load() {
					peakLive.Store(l)
				}
			}
		}
	}()
	fmt.Println(l.Addr().String())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "reset":
			// Twice: pooled buffers (sync.Pool) of the last read survive
			// one collection.
			runtime.GC()
			runtime.GC()
			h, l, gcs := read()
			peak.Store(h)
			peakLive.Store(l)
			fmt.Println(h, l, gcs)
		case "report":
			h, l, gcs := read()
			fmt.Println(max(peak.Load(), h), max(peakLive.Load(), l), gcs)
		case "rss":
			hwm, rss := procStatus("VmHWM:"), procStatus("VmRSS:")
			fmt.Println(hwm, rss)
		}
	}
	close(done)
	gs.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Close(ctx)
}

// procStatus returns a size field of /proc/self/status in bytes (0 where
// there is none, e.g. not on Linux).
func procStatus(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
