package host

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/wasm/abi"
)

// TestSizeAndReclaimOverMemkv: memkv declares SIZE and RECLAIM, so its store
// is a kv.Sizer whose size follows the bytes written and deleted, and
// Reclaim reaches the plugin; both refuse after Close as every call does.
func TestSizeAndReclaimOverMemkv(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	p := loadPlugin(t, "memkv", Options{Registerer: reg})
	s, err := p.Open(ctx, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sz, ok := s.(kv.Sizer)
	if !ok {
		t.Fatalf("memkv declares SIZE (ops %#x), but its store is a %T, not a kv.Sizer", s.Manifest().Ops, s)
	}
	size := func() int64 {
		t.Helper()
		n, err := sz.Size()
		if err != nil {
			t.Fatalf("Size: %v", err)
		}
		return n
	}
	if n := size(); n != 0 {
		t.Errorf("Size of an empty memkv = %d, want 0", n)
	}
	var ops []kv.Op
	for i := range 10 {
		ops = append(ops, kv.Put(fmt.Appendf(nil, "k%d", i), make([]byte, 1000)))
	}
	if err := s.Commit(ctx, ops); err != nil {
		t.Fatal(err)
	}
	if n := size(); n != 10*(2+1000) {
		t.Errorf("Size after 10 pairs of 1002 bytes = %d, want %d", n, 10*1002)
	}
	if err := s.Commit(ctx, []kv.Op{kv.Delete([]byte("k0")), kv.Put([]byte("k1"), []byte("x"))}); err != nil {
		t.Fatal(err)
	}
	if n := size(); n != 8*1002+3 {
		t.Errorf("Size after a delete and a shrinking put = %d, want %d", n, 8*1002+3)
	}
	calls := func() float64 { return opCalls(t, reg, "memkv-wasm", abi.OpReclaim) }
	before := calls()
	if err := s.Reclaim(ctx); err != nil {
		t.Fatalf("Reclaim: %v", err)
	}
	if got := calls(); got != before+1 {
		t.Errorf("RECLAIM calls %v -> %v, want one more", before, got)
	}
	if v, err := s.Get(ctx, []byte("k9")); err != nil || len(v) != 1000 {
		t.Errorf("Get after Reclaim: %d bytes, %v", len(v), err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Reclaim(ctx); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Reclaim after Close: %v, want kv.ErrClosed", err)
	}
	if _, err := sz.Size(); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Size after Close: %v, want kv.ErrClosed", err)
	}
}

// TestUndeclaredSpaceOps: a plugin that declares neither SIZE nor RECLAIM
// gives a store that is not a kv.Sizer (so the core warns that no quota can
// be enforced and publishes no size), and whose Reclaim succeeds without
// calling the plugin: the store has no instance it could call.
func TestUndeclaredSpaceOps(t *testing.T) {
	s := &Store{manifest: abi.Manifest{Name: "old", Ops: abi.RequiredOps}}
	if _, ok := s.engine().(kv.Sizer); ok {
		t.Error("a store without SIZE is a kv.Sizer")
	}
	if err := s.Reclaim(context.Background()); err != nil {
		t.Errorf("Reclaim without RECLAIM: %v, want nil (no work)", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Reclaim(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Reclaim with an ended context: %v, want context.Canceled", err)
	}
	s.manifest.Ops |= abi.OpSize.Bit()
	if _, ok := s.engine().(kv.Sizer); !ok {
		t.Error("a store with SIZE is not a kv.Sizer")
	}
}

// TestFaultySpaceOps: SIZE and RECLAIM are forwarded like any op, a status
// answer maps to its error as for any op, and an instance that crashes, answers garbage or overruns its deadline in
// either is discarded and replaced like in any other op, the caller
// getting a clean error and the data staying intact.
func TestFaultySpaceOps(t *testing.T) {
	e := newFaulty(t, Options{}, 2)
	e.srv.size.Store(12345)
	sz, ok := e.store.(kv.Sizer)
	if !ok {
		t.Fatalf("faulty declares SIZE, but its store is a %T", e.store)
	}
	if n, err := sz.Size(); n != 12345 || err != nil {
		t.Errorf("Size = %d, %v; the remote says 12345", n, err)
	}
	e.srv.size.Store(-1)
	before := e.store.Stats().Failures
	if _, err := sz.Size(); !errors.Is(err, ErrUnavailable) || e.store.Stats().Failures != before {
		t.Errorf("Size answered UNAVAILABLE: %v (failures %d -> %d); want ErrUnavailable, the instance kept", err, before, e.store.Stats().Failures)
	}
	if err := e.store.Reclaim(context.Background()); err != nil || e.srv.reclaims.Load() != 1 {
		t.Errorf("Reclaim: %v, the remote served %d RECLAIMs, want 1", err, e.srv.reclaims.Load())
	}

	for _, c := range []struct {
		word string
		is   error
	}{
		{"panic", ErrCrashed},
		{"garbage", ErrProtocol},
		{"sleep", context.DeadlineExceeded},
	} {
		t.Run(c.word, func(t *testing.T) {
			e := newFaultyConfig(t, Options{}, 2, "space="+c.word)
			want := e.seed(t)
			sz := e.store.(kv.Sizer)
			if c.word != "sleep" { // kv.Sizer has no context: the call timeout bounds it
				if _, err := sz.Size(); !errors.Is(err, c.is) {
					t.Errorf("Size: %v, want %v", err, c.is)
				}
				e.waitReplaced(t, 2)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			before := e.store.Stats().Failures
			if err := e.store.Reclaim(ctx); !errors.Is(err, c.is) {
				t.Errorf("Reclaim: %v, want %v", err, c.is)
			}
			if got := e.store.Stats().Failures; got != before+1 {
				t.Errorf("failures %d -> %d, want the instance discarded", before, got)
			}
			e.waitReplaced(t, 2)
			e.checkServing(t, want)
		})
	}
}

// opCalls returns engram_wasm_calls_total of one plugin's op.
func opCalls(t *testing.T, reg *prometheus.Registry, plugin string, op abi.Op) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "engram_wasm_calls_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["plugin"] == plugin && labels["op"] == op.String() {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestSpaceRoundOnMemkv: Status, the size metric, the quota and defrag on
// memkv.wasm, whose RECLAIM calls the host counts.
func TestSpaceRoundOnMemkv(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := loadPlugin(t, "memkv", Options{Registerer: reg})
	s, err := p.Open(context.Background(), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	servertest.SpaceRound(t, s, 1<<20, func() int64 { return int64(opCalls(t, reg, "memkv-wasm", abi.OpReclaim)) })
}
