package host

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/proctest"
)

// benchStores returns memkv natively and as memkv.wasm, loaded with keys.
func benchStores(b *testing.B) map[string]kv.Store {
	p := loadPlugin(b, "memkv", Options{})
	w, err := p.Open(context.Background(), StoreOptions{IdleInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = w.Close() })
	stores := map[string]kv.Store{"native": memkv.New(), "wasm": w}
	for _, s := range stores {
		var ops []kv.Op
		for i := range 1000 {
			ops = append(ops, kv.Put(fmt.Appendf(nil, "/registry/pods/default/pod-%04d", i), make([]byte, 256)))
		}
		if err := s.Commit(context.Background(), ops); err != nil {
			b.Fatal(err)
		}
	}
	return stores
}

// BenchmarkGet measures one point read of a 256-byte value, native and
// through the host: the difference is the per-call overhead of the ABI
// (encode, copy into the guest, the wasm call, decode, copy out) plus memkv
// running as wasm.
func BenchmarkGet(b *testing.B) {
	stores := benchStores(b)
	key := []byte("/registry/pods/default/pod-0500")
	for _, name := range []string{"native", "wasm"} {
		s := stores[name]
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			defer proctest.ReportCPU(b)()
			for b.Loop() {
				if _, err := s.Get(ctx, key); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCommit measures a 16-op batch of puts.
func BenchmarkCommit(b *testing.B) {
	stores := benchStores(b)
	ops := make([]kv.Op, 16)
	for i := range ops {
		ops[i] = kv.Put(fmt.Appendf(nil, "/registry/leases/l-%02d", i), make([]byte, 128))
	}
	for _, name := range []string{"native", "wasm"} {
		s := stores[name]
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			defer proctest.ReportCPU(b)()
			for b.Loop() {
				if err := s.Commit(ctx, ops); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkScan100 measures a 100-pair range read in one batch.
func BenchmarkScan100(b *testing.B) {
	stores := benchStores(b)
	for _, name := range []string{"native", "wasm"} {
		s := stores[name]
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			defer proctest.ReportCPU(b)()
			for b.Loop() {
				it, err := s.Scan(ctx, kv.ScanOptions{Start: []byte("/registry/pods/default/pod-0100"), Limit: 100, BatchSize: 100})
				if err != nil {
					b.Fatal(err)
				}
				if batch, err := it.Next(ctx); err != nil || len(batch) != 100 {
					b.Fatalf("%d pairs, %v", len(batch), err)
				}
				_ = it.Close()
			}
		})
	}
}

// BenchmarkInstance measures starting one memkv.wasm store (instantiate,
// _initialize, INIT) and reports the Go heap and linear memory it holds.
func BenchmarkInstance(b *testing.B) {
	p := loadPlugin(b, "memkv", Options{})
	ctx := context.Background()
	var stores []*Store
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for b.Loop() {
		s, err := p.open(ctx, StoreOptions{IdleInterval: -1})
		if err != nil {
			b.Fatal(err)
		}
		stores = append(stores, s)
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	var linear int64
	for _, s := range stores {
		linear += s.idle[0].memSize.Load()
	}
	n := float64(len(stores))
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n/(1<<20), "MiB-heap/instance")
	b.ReportMetric(float64(linear)/n/(1<<20), "MiB-linear/instance")
	for _, s := range stores {
		_ = s.Close()
	}
}
