package mvcc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/proctest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Engines the benchmarks run on: the in-memory one isolates the core's own
// cost; badger on disk is the default deployment.
func benchStores(b *testing.B) map[string]func() kv.Store {
	return map[string]func() kv.Store{
		"memkv": func() kv.Store { return memkv.New() },
		"badger": func() kv.Store {
			s, err := badger.Open(badger.Options{Dir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			return s
		},
	}
}

// openBench opens a Backend on s, closed when the benchmark ends.
func openBench(b *testing.B, s kv.Store) *Backend {
	b.Helper()
	be, err := Open(context.Background(), Options{Store: s, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	return be
}

func load(b *testing.B, be *Backend, n int) {
	b.Helper()
	val := bytes.Repeat([]byte("v"), 512)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 16 {
				key := fmt.Sprintf("/registry/pods/default/pod-%06d-%s", i, "abcdefghijklmnopqrstuvwxyz0123")
				if _, err := be.Put(context.Background(), &pb.PutRequest{Key: []byte(key), Value: val}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkPaginatedList lists 10,000 keys 500 at a time, pinned to the
// first page's revision and continued from lastKey+"\x00", as kube-apiserver's
// reflector does.
func BenchmarkPaginatedList(b *testing.B) {
	for name, open := range benchStores(b) {
		b.Run(name, func(b *testing.B) {
			be := openBench(b, open())
			load(b, be, 10000)
			prefix := []byte("/registry/pods/")
			end := []byte("/registry/pods0")
			b.ResetTimer()
			for b.Loop() {
				from, rev, n := prefix, int64(0), 0
				for {
					r, err := be.Range(context.Background(), &pb.RangeRequest{Key: from, RangeEnd: end, Limit: 500, Revision: rev})
					if err != nil {
						b.Fatal(err)
					}
					n += len(r.Kvs)
					rev = r.Header.Revision
					if !r.More {
						break
					}
					from = append(bytes.Clone(r.Kvs[len(r.Kvs)-1].Key), 0)
				}
				if n != 10000 {
					b.Fatalf("listed %d keys", n)
				}
			}
		})
	}
}

func BenchmarkGet(b *testing.B) {
	for name, open := range benchStores(b) {
		b.Run(name, func(b *testing.B) {
			be := openBench(b, open())
			load(b, be, 10000)
			key := []byte(fmt.Sprintf("/registry/pods/default/pod-%06d-%s", 4242, "abcdefghijklmnopqrstuvwxyz0123"))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb2 *testing.PB) {
				for pb2.Next() {
					if _, err := be.Range(context.Background(), &pb.RangeRequest{Key: key, Limit: 1}); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkCreateParallel measures group commit: many concurrent creates.
func BenchmarkCreateParallel(b *testing.B) {
	for name, open := range benchStores(b) {
		b.Run(name, func(b *testing.B) {
			be := openBench(b, open())
			val := bytes.Repeat([]byte("v"), 512)
			var mu sync.Mutex
			next := 0
			b.SetParallelism(32)
			b.ReportAllocs()
			cpu := proctest.CPUTime()
			b.ResetTimer()
			defer func() { b.ReportMetric(float64(proctest.CPUTime()-cpu)/float64(b.N)/1e3, "cpu-us/op") }()
			b.RunParallel(func(p *testing.PB) {
				for p.Next() {
					mu.Lock()
					i := next
					next++
					mu.Unlock()
					key := []byte(fmt.Sprintf("/registry/events/default/ev-%09d", i))
					r, err := be.Txn(context.Background(), &pb.TxnRequest{
						Compare: []*pb.Compare{{Key: key, Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: 0}}},
						Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: key, Value: val}}}},
					})
					if err != nil || !r.Succeeded {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkUpdateParallel is kube-apiserver's update: a Get of the object,
// then `If mod=rev Then Put Else Get`, from 64 concurrent clients over
// 10,000 keys. cpu-us/op is the process's CPU time per update (the core and
// the engine, no gRPC), which is what bounds throughput on a busy machine
// where wall-clock time is noisy.
func BenchmarkUpdateParallel(b *testing.B) {
	for name, open := range benchStores(b) {
		b.Run(name, func(b *testing.B) {
			be := openBench(b, open())
			const n = 10000
			load(b, be, n)
			val := bytes.Repeat([]byte("u"), 512)
			var seq atomic.Int64
			b.SetParallelism(32)
			b.ReportAllocs()
			cpu := proctest.CPUTime()
			b.ResetTimer()
			b.RunParallel(func(p *testing.PB) {
				for p.Next() {
					i := seq.Add(7919) % n
					key := []byte(fmt.Sprintf("/registry/pods/default/pod-%06d-%s", i, "abcdefghijklmnopqrstuvwxyz0123"))
					got, err := be.Range(context.Background(), &pb.RangeRequest{Key: key})
					if err != nil || len(got.Kvs) != 1 {
						b.Fatalf("get %s: %v", key, err)
					}
					_, err = be.Txn(context.Background(), &pb.TxnRequest{
						Compare: []*pb.Compare{{Key: key, Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: got.Kvs[0].ModRevision}}},
						Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: key, Value: val}}}},
						Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: key}}}},
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(proctest.CPUTime()-cpu)/float64(b.N)/1e3, "cpu-us/op")
		})
	}
}

// BenchmarkCreateRandom is kube-apiserver's create from 300 concurrent
// clients on fresh keys in random order (as object names arrive), 70-byte
// keys and 512-byte values. writer-us/op is the single writer's serial time
// per create: 1e6 / writer-us/op is the create rate one writer allows.
func BenchmarkCreateRandom(b *testing.B) {
	for name, open := range benchStores(b) {
		b.Run(name, func(b *testing.B) {
			be := openBench(b, open())
			val := bytes.Repeat([]byte("v"), 512)
			var seq atomic.Uint64
			b.SetParallelism(150)
			b.ReportAllocs()
			cpu := proctest.CPUTime()
			busy := be.writerBusy.Load()
			b.ResetTimer()
			b.RunParallel(func(p *testing.PB) {
				for p.Next() {
					i := seq.Add(1)
					key := fmt.Appendf(nil, "/registry/pods/ns-%016x/%032x", i*0x9e3779b97f4a7c15, i)
					r, err := be.Txn(context.Background(), &pb.TxnRequest{
						Compare: []*pb.Compare{{Key: key, Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: 0}}},
						Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: key, Value: val}}}},
					})
					if err != nil || !r.Succeeded {
						b.Fatal(err)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(proctest.CPUTime()-cpu)/float64(b.N)/1e3, "cpu-us/op")
			b.ReportMetric(float64(be.writerBusy.Load()-busy)/float64(b.N)/1e3, "writer-us/op")
		})
	}
}

// BenchmarkWriterSerial measures the writer's own cost per create, with no
// clients competing for the CPU: b.N creates of random keys, read ahead as
// their goroutines would, are queued at once and the writer evaluates them
// while the committer commits. writer-us/op is the serial time per create;
// 1e6 / writer-us/op is the create rate one writer allows on this machine.
func BenchmarkWriterSerial(b *testing.B) {
	for name, open := range benchStores(b) {
		b.Run(name, func(b *testing.B) {
			be := openBench(b, open())
			ctx := context.Background()
			val := bytes.Repeat([]byte("v"), 512)
			txns := make([]*pb.TxnRequest, b.N)
			for i := range txns {
				key := fmt.Appendf(nil, "/registry/pods/ns-%016x/%032x", uint64(i)*0x9e3779b97f4a7c15, i)
				txns[i] = &pb.TxnRequest{
					Compare: []*pb.Compare{{Key: key, Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: 0}}},
					Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: key, Value: val}}}},
				}
			}
			done := make(chan *request, 8192)
			b.ReportAllocs()
			busy := be.writerBusy.Load()
			b.ResetTimer()
			go func() {
				// Each request is read ahead just before it is queued, as
				// a client's goroutine does.
				for _, t := range txns {
					r := be.txnRequest(ctx, t, false)
					r.ctx, r.done = ctx, make(chan struct{}, 1)
					be.reqs <- r
					done <- r
				}
			}()
			for range txns {
				r := <-done
				<-r.done
				if res := r.res; res.err != nil || !res.txn.Succeeded {
					b.Fatal(res.err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(be.writerBusy.Load()-busy)/float64(b.N)/1e3, "writer-us/op")
		})
	}
}
