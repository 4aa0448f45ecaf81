// Package enginetest holds what the embedded adaptors' tests and benchmarks
// (engines/badger, engines/pebble) share beyond the conformance suite
// (core/kv/kvtest): key and value shapes, loading helpers, and checks that
// need only a kv.Store.
//
// It imports package testing and must be imported from _test files only. It
// must not know any engine: checks that reach into an adaptor's internals
// (its committer, its files) stay in that adaptor's tests.
package enginetest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/groupcommit"
)

// Benchmark batches mimic one etcd write: ~70-byte keys and 512-byte values.
const (
	BenchKeyLen = 70
	BenchValLen = 512
)

// BenchKey is the i-th key of a benchmark, shaped like Engram's keys of a
// resource.
func BenchKey(prefix string, i int64) []byte {
	k := fmt.Appendf(nil, "/registry/%s/namespace-%04d/object-%016d", prefix, i%1000, i)
	for len(k) < BenchKeyLen {
		k = append(k, '.')
	}
	return k
}

// CommitEach commits op(0) .. op(n-1) in batches of 1000.
func CommitEach(tb testing.TB, s kv.Store, n int64, op func(i int64) kv.Op) {
	tb.Helper()
	ops := make([]kv.Op, 0, 1000)
	for i := int64(0); i < n; i++ {
		ops = append(ops, op(i))
		if len(ops) == cap(ops) || i == n-1 {
			if err := s.Commit(context.Background(), ops); err != nil {
				tb.Fatal(err)
			}
			ops = ops[:0]
		}
	}
}

// RunCommitters runs b.N operations on exactly n goroutines and reports
// throughput; op receives a unique sequence number.
func RunCommitters(b *testing.B, n int, op func(seq int64) error) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if err := op(i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "commits/s")
}

// RevKey is the i-th key WriteRevisions writes.
func RevKey(i int) []byte { return fmt.Appendf(nil, "h/key/%08d", i) }

// WriteRevisions commits keys from..from+n-1 with 512 random bytes each
// (incompressible, as distinct objects are) in batches, as the core writes
// revisions.
func WriteRevisions(tb testing.TB, s kv.Store, from, n int) {
	tb.Helper()
	for i := from; i < from+n; i += 1000 {
		var ops []kv.Op
		for j := i; j < min(i+1000, from+n); j++ {
			v := make([]byte, 512)
			_, _ = rand.Read(v)
			ops = append(ops, kv.Put(RevKey(j), v))
		}
		if err := s.Commit(context.Background(), ops); err != nil {
			tb.Fatal(err)
		}
	}
}

// Drain reads it to its end as "key=value" pairs separated by spaces.
func Drain(t *testing.T, it kv.Iterator) string {
	t.Helper()
	var out []string
	for {
		batch, err := it.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(batch) == 0 {
			return strings.Join(out, " ")
		}
		for _, p := range batch {
			out = append(out, string(p.Key)+"="+string(p.Value))
		}
	}
}

// ConditionsAfterWrites runs conditions on a key the committer wrote moments
// before (which an adaptor's condition cache may prove without reading the
// engine): what is proved must match what the engine holds, and a conflict
// must still report the engine's current value.
func ConditionsAfterWrites(t *testing.T, s kv.Store) {
	t.Helper()
	ctx := context.Background()
	k := []byte("k")
	if err := s.Commit(ctx, []kv.Op{kv.PutIfAbsent(k, []byte("v1"))}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, []kv.Op{kv.CompareAndSwap(k, []byte("v1"), []byte("v2"))}); err != nil {
		t.Fatal(err)
	}
	err := s.Commit(ctx, []kv.Op{kv.CompareAndSwap(k, []byte("v1"), []byte("v3"))})
	c, ok := kv.AsConflict(err)
	if !ok || !c.Exists || string(c.Current) != "v2" {
		t.Fatalf("stale CAS: %v (conflict %+v)", err, c)
	}
	if err := s.Commit(ctx, []kv.Op{kv.CompareAndDelete(k, []byte("v2"))}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, k); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if err := s.Commit(ctx, []kv.Op{kv.PutIfAbsent(k, []byte("again"))}); err != nil {
		t.Fatal(err)
	}
	err = s.Commit(ctx, []kv.Op{kv.PutIfAbsent(k, []byte("twice"))})
	if c, ok := kv.AsConflict(err); !ok || string(c.Current) != "again" {
		t.Fatalf("put-if-absent on a present key: %v", err)
	}
}

// GroupSemantics hands one group of batches straight to an adaptor's
// committer (commit), so the grouping is deterministic: later batches see
// earlier ones, a conflicting batch is skipped without disturbing its
// neighbours, and the group is one engine write (groups counts them).
func GroupSemantics(t *testing.T, s kv.Store, commit func([]*groupcommit.Request), groups func() uint64) {
	t.Helper()
	ctx := context.Background()
	if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("b"), []byte("b0"))}); err != nil {
		t.Fatal(err)
	}
	batches := [][]kv.Op{
		{kv.PutIfAbsent([]byte("a"), []byte("1"))},
		{kv.CompareAndSwap([]byte("a"), []byte("1"), []byte("2")), kv.Put([]byte("c"), []byte("c"))},
		{kv.Put([]byte("d"), []byte("d")), kv.CompareAndSwap([]byte("a"), []byte("1"), []byte("3"))}, // conflicts: a is 2 now
		{kv.CompareAndDelete([]byte("b"), []byte("b0"))},
		{kv.PutIfAbsent([]byte("b"), []byte("b1"))},                // b was deleted earlier in the group
		{kv.PutIfAbsent([]byte("c"), []byte("x"))},                 // conflicts with batch 1's write
		{kv.CompareAndSwap([]byte("d"), []byte("d"), []byte("y"))}, // batch 2 did not apply
	}
	reqs := make([]*groupcommit.Request, len(batches))
	for i, ops := range batches {
		reqs[i] = groupcommit.NewRequest(ops)
	}
	before := groups()
	commit(reqs)
	if g := groups() - before; g != 1 {
		t.Errorf("group took %d engine writes, want 1", g)
	}
	want := []struct {
		conflict bool
		index    int
		current  string
		exists   bool
	}{{}, {}, {true, 1, "2", true}, {}, {}, {true, 0, "c", true}, {true, 0, "", false}}
	for i, r := range reqs {
		err := <-r.Done()
		c, isC := kv.AsConflict(err)
		switch {
		case !want[i].conflict && err != nil:
			t.Errorf("batch %d: %v, want success", i, err)
		case want[i].conflict && !isC:
			t.Errorf("batch %d: %v, want a conflict", i, err)
		case want[i].conflict && (c.Index != want[i].index || c.Exists != want[i].exists || string(c.Current) != want[i].current):
			t.Errorf("batch %d: conflict %+v, want index %d exists %v current %q", i, c, want[i].index, want[i].exists, want[i].current)
		}
	}
	for k, v := range map[string]string{"a": "2", "b": "b1", "c": "c"} {
		if got, err := s.Get(ctx, []byte(k)); err != nil || string(got) != v {
			t.Errorf("Get(%q) = %q, %v; want %q", k, got, err, v)
		}
	}
	if _, err := s.Get(ctx, []byte("d")); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("Get(d) = %v; the conflicting batch's Put landed", err)
	}
}

// CommitsShareFsync commits from many goroutines at once and checks, with
// the adaptor's counters (stats: batches applied, engine writes), that they
// were grouped: far fewer writes, each one fsync, than batches.
func CommitsShareFsync(t *testing.T, s kv.Store, stats func() (batches, groups uint64)) {
	t.Helper()
	ctx := context.Background()
	const goroutines, per = 32, 20
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				if err := s.Commit(ctx, []kv.Op{kv.Put(fmt.Appendf(nil, "g/%d/%d", g, i), []byte("v"))}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	batches, groups := stats()
	t.Logf("%d batches in %d groups", batches, groups)
	if batches != goroutines*per {
		t.Errorf("%d batches applied, want %d", batches, goroutines*per)
	}
	if groups*2 > batches {
		t.Errorf("%d batches took %d fsyncs; concurrent commits are not being grouped", batches, groups)
	}
}

// ReclaimWhileCommitting runs a reclamation while commits arrive: no commit
// fails. It closes s and checks that Reclaim then says so.
func ReclaimWhileCommitting(t *testing.T, s interface {
	kv.Store
	kv.Reclaimer
}) {
	t.Helper()
	WriteRevisions(t, s, 0, 5000)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	started := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				if w == 0 && i == 10 {
					close(started)
				}
				k := RevKey(w*1000 + i)
				if err := s.Commit(context.Background(), []kv.Op{kv.Put(k, []byte("v")), kv.Delete(RevKey(5000 + w*1000 + i))}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	<-started
	if err := s.Reclaim(context.Background()); err != nil {
		t.Errorf("Reclaim: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("commit during reclamation: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Reclaim(context.Background()); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Reclaim after Close: %v, want ErrClosed", err)
	}
}

// ScanSnapshotAndDeletes checks what a scan sees over an engine's versions
// and tombstones: overwritten keys once with their latest value, deleted
// keys not at all, a key deleted and written again with its new value, in
// either direction; and a scan answers as of when it was opened.
func ScanSnapshotAndDeletes(t *testing.T, s kv.Store) {
	t.Helper()
	ctx := context.Background()
	commit := func(ops ...kv.Op) {
		t.Helper()
		if err := s.Commit(ctx, ops); err != nil {
			t.Fatal(err)
		}
	}
	scan := func(o kv.ScanOptions) kv.Iterator {
		t.Helper()
		it, err := s.Scan(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = it.Close() })
		return it
	}
	for i := range 6 {
		commit(kv.Put(fmt.Appendf(nil, "k%d", i), []byte("v0")))
	}
	for v := 1; v <= 3; v++ {
		commit(kv.Put([]byte("k1"), fmt.Appendf(nil, "v%d", v)))
	}
	commit(kv.Delete([]byte("k2")))
	commit(kv.Delete([]byte("k3")))
	commit(kv.Put([]byte("k3"), []byte("again")))
	commit(kv.Delete([]byte("k5")))

	snap := scan(kv.ScanOptions{Start: []byte("k"), End: []byte("l"), BatchSize: 1})
	rev := scan(kv.ScanOptions{Start: []byte("k"), End: []byte("l"), Reverse: true, BatchSize: 2})
	// Changes after the scans were opened must not show in them.
	commit(kv.Delete([]byte("k0")), kv.Put([]byte("k1"), []byte("later")), kv.Put([]byte("k2"), []byte("back")))

	if got, want := Drain(t, snap), "k0=v0 k1=v3 k3=again k4=v0"; got != want {
		t.Errorf("snapshot scan = %q, want %q", got, want)
	}
	if got, want := Drain(t, rev), "k4=v0 k3=again k1=v3 k0=v0"; got != want {
		t.Errorf("reverse snapshot scan = %q, want %q", got, want)
	}
	if got, want := Drain(t, scan(kv.ScanOptions{Start: []byte("k1"), End: []byte("k4")})), "k1=later k2=back k3=again"; got != want {
		t.Errorf("scan after changes = %q, want %q", got, want)
	}
	if got, want := Drain(t, scan(kv.ScanOptions{Start: []byte("k"), End: []byte("l"), Limit: 2})), "k1=later k2=back"; got != want {
		t.Errorf("scan with limit = %q, want %q", got, want)
	}
}

// BenchCommit measures durable commits of 3-op batches, one etcd write's
// worth (a PutIfAbsent, a Put of a pre-existing key and a small Put), from
// 1 and 64 committers on stores open makes; stats returns the adaptor's
// batches applied and engine writes, whose ratio is reported as the
// group-commit factor, batches/fsync.
func BenchCommit(b *testing.B, open func(b *testing.B) kv.Store, stats func(kv.Store) (batches, groups uint64)) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("committers=%d", n), func(b *testing.B) {
			s := open(b)
			ctx := context.Background()
			val := make([]byte, BenchValLen)
			// One CAS target per committer slot keeps the CAS uncontended;
			// contention is not what this measures.
			for i := int64(0); i < 1024; i++ {
				if err := s.Commit(ctx, []kv.Op{kv.Put(BenchKey("cas", i), val)}); err != nil {
					b.Fatal(err)
				}
			}
			batches0, groups0 := stats(s)
			RunCommitters(b, n, func(seq int64) error {
				return s.Commit(ctx, []kv.Op{
					kv.PutIfAbsent(BenchKey("new", seq), val),
					// Only sequence numbers congruent modulo 1024 share a
					// key, and they are 1024 commits apart.
					kv.Put(BenchKey("cas", seq%1024), val),
					kv.Put(BenchKey("side", seq), val[:64]),
				})
			})
			batches, groups := stats(s)
			if g := groups - groups0; g > 0 {
				b.ReportMetric(float64(batches-batches0)/float64(g), "batches/fsync")
			}
		})
	}
}

// BenchGet reads 4,096 of 100,000 keys in parallel.
func BenchGet(b *testing.B, s kv.Store) {
	ctx := context.Background()
	const n = 100_000
	val := make([]byte, BenchValLen)
	CommitEach(b, s, n, func(i int64) kv.Op { return kv.Put(BenchKey("get", i), val) })
	keys := make([][]byte, 4096)
	for i := range keys {
		keys[i] = BenchKey("get", int64(i)*7919%n)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := s.Get(ctx, keys[i%len(keys)]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchScanBeforeDeletedRun scans 10 live keys that sort just before
// 50,000 deleted ones, as a list of one resource next to a resource that was
// just deleted, or compaction reading one key's history next to compacted
// history. The cost must stay that of 10 keys, not of the deleted run.
func BenchScanBeforeDeletedRun(b *testing.B, s kv.Store) {
	ctx := context.Background()
	val := make([]byte, BenchValLen)
	const deleted = 50_000
	CommitEach(b, s, deleted, func(i int64) kv.Op { return kv.Put(BenchKey("pods", i), val) })
	CommitEach(b, s, deleted, func(i int64) kv.Op { return kv.Delete(BenchKey("pods", i)) })
	var ops []kv.Op
	for i := int64(0); i < 10; i++ {
		ops = append(ops, kv.Put(BenchKey("nodes", i), val))
	}
	if err := s.Commit(ctx, ops); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		it, err := s.Scan(ctx, kv.ScanOptions{Start: []byte("/registry/nodes/"), End: []byte("/registry/nodes0")})
		if err != nil {
			b.Fatal(err)
		}
		batch, err := it.Next(ctx)
		if err != nil || len(batch) != 10 {
			b.Fatalf("scan = %d pairs, %v; want 10", len(batch), err)
		}
		it.Close()
	}
}
