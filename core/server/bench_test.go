package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/proctest"
)

// The request benchmarks measure what the server process spends per
// request, and nothing of the client: the client is this test binary run
// again as a child process (benchClientEnv), so the allocations and CPU
// time the benchmark reports are the server's alone. Each workload runs
// against three servers, so the cost of each layer is the difference of
// two rows:
//
//   - bare: gRPC with GRPCServerOptions and a KV service that answers a
//     prepared response of the same shape (transport, codec, stream setup);
//   - interceptors: the same with the server's Interceptors();
//   - full: the whole server (interceptors, etcdapi, mvcc, watch hub) on
//     memkv, with a metrics registry as cmd/engram has.
//
// The workloads are kube-apiserver's request shapes (bench/README.md,
// "kube-apiserver's requests"): a create
// is Txn{If mod(k)=0 Then Put} of a fresh random 70-byte key with a
// 512-byte value, an update Txn{If mod(k)=rev Then Put Else Get}, a get a
// linearizable Range{k, limit 1}; put is a plain Put of a fresh key.
const (
	benchClientEnv     = "ENGRAM_BENCH_CLIENT"
	benchClients       = 32   // requests in flight, on one connection as kube-apiserver's
	benchPreload       = 2048 // keys the updates and gets use
	benchValueBytes    = 512
	benchKeyBytes      = 70
	benchWarmupOps     = 2000
	benchCreatedPrefix = "/registry/events/default/"
	benchPreloadPrefix = "/registry/pods/default/pod-with-a-kubernetes-like-name-"
)

var benchWorkloads = []string{"put", "create", "update", "get"}

func TestMain(m *testing.M) {
	if addr := os.Getenv(benchClientEnv); addr != "" {
		if err := runBenchClient(addr, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "bench client:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func BenchmarkRequests(b *testing.B) {
	for _, kind := range []string{"bare", "interceptors", "full"} {
		b.Run(kind, func(b *testing.B) {
			addr := startBenchServer(b, kind)
			c := startBenchClient(b, addr)
			c.do(b, "preload", benchPreload)
			for _, w := range benchWorkloads {
				b.Run(w, func(b *testing.B) {
					c.do(b, w, benchWarmupOps)
					b.ReportAllocs()
					cpu := proctest.CPUTime()
					b.ResetTimer()
					c.do(b, w, b.N)
					b.StopTimer()
					b.ReportMetric(float64(proctest.CPUTime()-cpu)/float64(b.N), "server-cpu-ns/op")
				})
			}
		})
	}
}

// startBenchServer serves kind (see above) on 127.0.0.1 until b ends.
func startBenchServer(b *testing.B, kind string) string {
	b.Helper()
	store := memkv.New()
	b.Cleanup(func() { _ = store.Close() })
	opts := Options{
		Store:      store,
		Logger:     slog.New(slog.DiscardHandler),
		Registerer: prometheus.NewRegistry(),
		Name:       "bench",
	}
	srv, err := New(context.Background(), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	sopts := GRPCServerOptions(opts, nil)
	switch kind {
	case "bare":
	case "interceptors", "full":
		sopts = append(sopts, srv.Interceptors()...)
	default:
		b.Fatalf("unknown server kind %q", kind)
	}
	gs := grpc.NewServer(sopts...)
	if kind == "full" {
		srv.Register(gs)
	} else {
		pb.RegisterKVServer(gs, newPreparedKV())
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(l)
	}()
	b.Cleanup(func() {
		gs.Stop()
		<-served
	})
	return l.Addr().String()
}

// preparedKV answers every request with a response made once, of the shape
// the real server gives, so that a bare server costs only gRPC's part.
type preparedKV struct {
	pb.UnimplementedKVServer
	put   *pb.PutResponse
	txn   *pb.TxnResponse
	rng   *pb.RangeResponse
	count atomic.Int64
}

func newPreparedKV() *preparedKV {
	h := func() *pb.ResponseHeader {
		return &pb.ResponseHeader{ClusterId: 1, MemberId: 1, Revision: 123456, RaftTerm: 1}
	}
	kv := &mvccpb.KeyValue{Key: []byte(benchPreloadPrefix + "00000001"), Value: make([]byte, benchValueBytes), CreateRevision: 3, ModRevision: 123456, Version: 9}
	return &preparedKV{
		put: &pb.PutResponse{Header: h()},
		txn: &pb.TxnResponse{Header: h(), Succeeded: true, Responses: []*pb.ResponseOp{
			{Response: &pb.ResponseOp_ResponsePut{ResponsePut: &pb.PutResponse{Header: &pb.ResponseHeader{Revision: 123456}}}},
		}},
		rng: &pb.RangeResponse{Header: h(), Kvs: []*mvccpb.KeyValue{kv}, Count: 1},
	}
}

func (p *preparedKV) Put(context.Context, *pb.PutRequest) (*pb.PutResponse, error) {
	return p.put, nil
}

func (p *preparedKV) Txn(context.Context, *pb.TxnRequest) (*pb.TxnResponse, error) {
	return p.txn, nil
}

func (p *preparedKV) Range(context.Context, *pb.RangeRequest) (*pb.RangeResponse, error) {
	return p.rng, nil
}

// benchClient drives the child process that sends the requests.
type benchClient struct {
	in  io.Writer
	out *bufio.Reader
}

func startBenchClient(b *testing.B, addr string) *benchClient {
	b.Helper()
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), benchClientEnv+"="+addr)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = in.Close() // the client exits at the end of its input
		_ = cmd.Wait()
	})
	return &benchClient{in: in, out: bufio.NewReader(out)}
}

// do runs n requests of workload w and waits for the last answer.
func (c *benchClient) do(b *testing.B, w string, n int) {
	if _, err := fmt.Fprintf(c.in, "%s %d\n", w, n); err != nil {
		b.Fatal(err)
	}
	line, err := c.out.ReadString('\n')
	if err != nil {
		b.Fatalf("bench client: %v", err)
	}
	if line != "ok\n" {
		b.Fatalf("bench client: %s", strings.TrimSpace(line))
	}
}

// runBenchClient is the child process: it reads "workload count" lines,
// runs each with benchClients requests in flight and answers "ok" or the
// first error.
func runBenchClient(addr string, in io.Reader, out io.Writer) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	c := &loadClient{kv: pb.NewKVClient(conn), value: make([]byte, benchValueBytes)}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		w, count, _ := strings.Cut(sc.Text(), " ")
		n, err := strconv.Atoi(count)
		if err == nil {
			err = c.run(w, n)
		}
		if err != nil {
			fmt.Fprintf(out, "error: %s %d: %v\n", w, n, err)
			continue
		}
		fmt.Fprintln(out, "ok")
	}
	return sc.Err()
}

type loadClient struct {
	kv    pb.KVClient
	value []byte
	// keys and revs are the preloaded keys and their mod revisions; the
	// worker w of a run updates only keys i with i%benchClients == w, so
	// its compares succeed.
	keys [][]byte
	revs []int64
}

func (c *loadClient) run(w string, n int) error {
	if w == "preload" {
		c.keys = make([][]byte, n)
		c.revs = make([]int64, n)
		for i := range c.keys {
			c.keys[i] = fmt.Appendf(nil, "%s%08d", benchPreloadPrefix, i)
		}
	}
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		firstErr error
		errOnce  sync.Once
	)
	for worker := range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			rnd := rand.New(rand.NewPCG(rand.Uint64(), uint64(worker)))
			for j := 0; ; j++ {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := c.one(ctx, w, worker, j, i, rnd); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// one sends request i (the worker's j-th) of workload w.
func (c *loadClient) one(ctx context.Context, w string, worker, j, i int, rnd *rand.Rand) error {
	switch w {
	case "preload":
		resp, err := c.kv.Put(ctx, &pb.PutRequest{Key: c.keys[i], Value: c.value})
		if err == nil {
			c.revs[i] = resp.Header.Revision
		}
		return err
	case "put":
		_, err := c.kv.Put(ctx, &pb.PutRequest{Key: randomKey(rnd), Value: c.value})
		return err
	case "create":
		key := randomKey(rnd)
		resp, err := c.kv.Txn(ctx, &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: key, Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: 0}}},
			Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: key, Value: c.value}}}},
		})
		if err == nil && !resp.Succeeded {
			err = fmt.Errorf("create of %s failed its compare", key)
		}
		return err
	case "update":
		per := len(c.keys) / benchClients
		k := worker + benchClients*(j%per)
		key := c.keys[k]
		resp, err := c.kv.Txn(ctx, &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: key, Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: c.revs[k]}}},
			Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: key, Value: c.value}}}},
			Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: key}}}},
		})
		if err == nil && !resp.Succeeded {
			err = fmt.Errorf("update of %s failed its compare", key)
		}
		if err == nil {
			c.revs[k] = resp.Header.Revision
		}
		return err
	case "get":
		_, err := c.kv.Range(ctx, &pb.RangeRequest{Key: c.keys[rnd.IntN(len(c.keys))], Limit: 1})
		return err
	}
	return fmt.Errorf("unknown workload %q", w)
}

// randomKey is a fresh key of benchKeyBytes in random order.
func randomKey(rnd *rand.Rand) []byte {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	k := make([]byte, benchKeyBytes)
	n := copy(k, benchCreatedPrefix)
	for i := n; i < len(k); i++ {
		k[i] = letters[rnd.IntN(len(letters))]
	}
	return k
}
