package mvcc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvfault"
	"github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/engines/memkv"
)

func open(t *testing.T, s kv.Store) *Backend {
	t.Helper()
	b, err := Open(context.Background(), Options{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func put(t *testing.T, b *Backend, k, v string) int64 {
	t.Helper()
	r, err := b.Put(context.Background(), &pb.PutRequest{Key: []byte(k), Value: []byte(v)})
	if err != nil {
		t.Fatalf("put %s: %v", k, err)
	}
	return r.Header.Revision
}

func del(t *testing.T, b *Backend, k string) int64 {
	t.Helper()
	r, err := b.DeleteRange(context.Background(), &pb.DeleteRangeRequest{Key: []byte(k)})
	if err != nil {
		t.Fatalf("delete %s: %v", k, err)
	}
	return r.Header.Revision
}

func get(t *testing.T, b *Backend, k string, rev int64) (*mvccpb.KeyValue, error) {
	t.Helper()
	r, err := b.Range(context.Background(), &pb.RangeRequest{Key: []byte(k), Revision: rev})
	if err != nil {
		return nil, err
	}
	if len(r.Kvs) == 0 {
		return nil, nil
	}
	return r.Kvs[0], nil
}

func countSpace(t *testing.T, s kv.Store, sp coder.Space) int {
	t.Helper()
	n := 0
	if err := kv.ScanEach(context.Background(), s, kv.ScanOptions{Start: coder.Prefix(sp), End: coder.SpaceEnd(sp)}, func(kv.Pair) error {
		n++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPhysicalCompaction checks what compaction removes and what every read
// at or above the compacted revision still needs.
func TestPhysicalCompaction(t *testing.T) {
	store := memkv.New()
	b := open(t, store)
	put(t, b, "a", "1") // 2
	put(t, b, "a", "2") // 3
	put(t, b, "a", "3") // 4
	put(t, b, "b", "1") // 5
	del(t, b, "b")      // 6
	put(t, b, "c", "1") // 7
	put(t, b, "a", "4") // 8
	ctx := context.Background()
	if _, err := b.Compact(ctx, 7, true); err != nil {
		t.Fatal(err)
	}
	// Revision keys hold a@8, b's tombstone (6) and c@7; history holds the
	// superseded a@2, a@3, a@4 and b@5. a keeps a@4 (what a read at 7
	// returns, and prev_kv of the event at 8); b was deleted at or below 7,
	// so its history and its tombstone go; c has no history.
	if got := countSpace(t, store, coder.SpaceObject); got != 1 {
		t.Errorf("history versions after compaction: %d, want 1", got)
	}
	if got := countSpace(t, store, coder.SpaceRevision); got != 2 {
		t.Errorf("revision keys after compaction: %d, want 2 (b's tombstone removed)", got)
	}
	if got := countSpace(t, store, coder.SpaceEvent); got != 2 {
		t.Errorf("change-log records after compaction: %d, want 2 (revisions 7, 8)", got)
	}
	if kv, err := get(t, b, "a", 7); err != nil || string(kv.Value) != "3" {
		t.Errorf("a at 7: %v %v", kv, err)
	}
	if _, err := get(t, b, "a", 6); !errors.Is(err, ErrCompacted) {
		t.Errorf("read below compaction: %v", err)
	}
	evs, next, err := b.Events(ctx, 7, 8, 100)
	if err != nil || next != 9 || len(evs) != 2 {
		t.Fatalf("events after compaction: %v next %d err %v", evs, next, err)
	}
	if evs[1].PrevKv == nil || string(evs[1].PrevKv.Value) != "3" {
		t.Errorf("prev_kv of the first event after compaction: %+v", evs[1].PrevKv)
	}
	// Re-create b after its revision key was cleaned up.
	put(t, b, "b", "again")
	if kv, _ := get(t, b, "b", 0); kv.CreateRevision != 9 || kv.Version != 1 {
		t.Errorf("re-created b: %+v", kv)
	}
	// A restart keeps the compacted revision and the head.
	_ = b.Close()
	b2 := open(t, store)
	if b2.CompactRev() != 7 || b2.Rev() != 9 {
		t.Errorf("after restart: compacted %d rev %d", b2.CompactRev(), b2.Rev())
	}
}

// TestUncertainCommitIsResolvedByReadingBack covers both outcomes of a
// commit whose result the engine could not report.
func TestUncertainCommitIsResolvedByReadingBack(t *testing.T) {
	store := kvfault.Wrap(memkv.New())
	b := open(t, store)
	uncertain := fmt.Errorf("timeout: %w", kv.ErrUncertain)
	store.FailCommits(kvfault.Fault{Err: uncertain, Apply: true})
	if rev := put(t, b, "a", "1"); rev != 2 {
		t.Fatalf("applied-but-uncertain write got revision %d", rev)
	}
	store.FailCommits(kvfault.Fault{Err: uncertain})
	if _, err := b.Put(context.Background(), &pb.PutRequest{Key: []byte("b"), Value: []byte("1")}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("not-applied uncertain write: %v", err)
	}
	if rev := put(t, b, "c", "1"); rev != 3 {
		t.Fatalf("revision after a write that did not happen: %d, want 3 (dense)", rev)
	}
	if kv, _ := get(t, b, "b", 0); kv != nil {
		t.Fatal("write that did not happen is visible")
	}
}

// TestLatestCacheFollowsUncertainOutcomes checks that the writer's cache of
// latest records never answers with a version the store does not hold: a
// cached key written by a batch that failed, or whose outcome was uncertain,
// reads as the store has it.
func TestLatestCacheFollowsUncertainOutcomes(t *testing.T) {
	store := kvfault.Wrap(memkv.New())
	b := open(t, store)
	put(t, b, "a", "1") // cached by the writer
	uncertain := fmt.Errorf("timeout: %w", kv.ErrUncertain)
	store.FailCommits(kvfault.Fault{Err: uncertain})
	if _, err := b.Put(context.Background(), &pb.PutRequest{Key: []byte("a"), Value: []byte("2")}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("not-applied uncertain write: %v", err)
	}
	if kv, _ := get(t, b, "a", 0); kv == nil || string(kv.Value) != "1" {
		t.Fatalf("after a write that did not happen: %+v, want 1", kv)
	}
	store.FailCommits(kvfault.Fault{Err: uncertain, Apply: true})
	rev := put(t, b, "a", "3")
	if kv, _ := get(t, b, "a", 0); kv == nil || string(kv.Value) != "3" || kv.ModRevision != rev || kv.Version != 2 {
		t.Fatalf("after an applied uncertain write: %+v, want 3 at %d version 2", kv, rev)
	}
	store.FailCommits(kvfault.Fault{Err: errors.New("write failed")})
	if _, err := b.DeleteRange(context.Background(), &pb.DeleteRangeRequest{Key: []byte("a")}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("failed delete: %v", err)
	}
	if kv, _ := get(t, b, "a", 0); kv == nil || string(kv.Value) != "3" {
		t.Fatalf("after a failed delete: %+v, want 3", kv)
	}
	if kv, _ := get(t, b, "a", rev-1); kv == nil || string(kv.Value) != "1" {
		t.Fatalf("read below the cached version: %+v, want 1", kv)
	}
}

func TestLatestCacheBounds(t *testing.T) {
	c := newLatestCache(64 << 10) // records up to 1 KiB
	rec := func(n int) []byte { return bytes.Repeat([]byte("v"), n) }
	_, _, gen := c.get([]byte("k"))
	c.set("other", rec(10))
	c.fill([]byte("k"), rec(10), gen)
	if _, ok, _ := c.get([]byte("k")); ok {
		t.Fatal("fill from before a write was accepted")
	}
	_, _, gen = c.get([]byte("k"))
	c.set("k", []byte("new"))
	c.fill([]byte("k"), []byte("old"), gen)
	if v, _, _ := c.get([]byte("k")); string(v) != "new" {
		t.Fatalf("fill replaced the writer's record: %q", v)
	}
	c.set("big", rec(2<<10))
	if _, ok, _ := c.get([]byte("big")); ok {
		t.Fatal("record over the per-record bound cached")
	}
	for i := range 1000 {
		c.set(fmt.Sprint("key", i), rec(512))
	}
	if _, _, n := c.stats(); n > 64<<10 {
		t.Fatalf("cache holds %d bytes, budget %d", n, 64<<10)
	}
	if _, ok, _ := c.get([]byte("key999")); !ok {
		t.Fatal("most recent record evicted")
	}
	if _, ok, _ := c.get([]byte("key0")); ok {
		t.Fatal("oldest record kept past the budget")
	}
	c.invalidate("key999")
	if _, ok, _ := c.get([]byte("key999")); ok {
		t.Fatal("invalidated record still cached")
	}

	// A replaced record is accounted at its new size, whether it grew or
	// shrank.
	c = newLatestCache(64 << 10)
	c.set("a", rec(100))
	c.set("a", rec(10))
	c.set("b", rec(10))
	c.set("b", rec(300))
	if _, _, n := c.stats(); n != int64(1+10+1+300+2*latestEntryOverhead) {
		t.Fatalf("cache accounts %d bytes after replacing records, want %d", n, 1+10+1+300+2*latestEntryOverhead)
	}
}

func TestStorageErrorsFailTheGroupWithoutPartialState(t *testing.T) {
	store := kvfault.Wrap(memkv.New())
	b := open(t, store)
	put(t, b, "a", "1")
	// "b" is not in the latest-record cache: the request's read ahead
	// fails, so the writer reads it again, and fails too.
	store.FailGets(kvfault.Fault{Err: errors.New("disk on fire")}, kvfault.Fault{Err: errors.New("disk on fire")})
	if _, err := b.Txn(context.Background(), &pb.TxnRequest{Success: []*pb.RequestOp{
		{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("a"), Value: []byte("2")}}},
		{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("b"), Value: []byte("2")}}},
	}}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("read failure inside the writer: %v", err)
	}
	store.FailCommits(kvfault.Fault{Err: errors.New("write failed")})
	if _, err := b.Put(context.Background(), &pb.PutRequest{Key: []byte("a"), Value: []byte("3")}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("commit failure: %v", err)
	}
	if kv, _ := get(t, b, "a", 0); string(kv.Value) != "1" || b.Rev() != 2 {
		t.Fatalf("state after failures: %+v rev %d", kv, b.Rev())
	}
	if kv, _ := get(t, b, "b", 0); kv != nil {
		t.Fatalf("b after failures: %+v", kv)
	}
	if rev := put(t, b, "a", "4"); rev != 3 {
		t.Fatalf("next revision %d", rev)
	}
}

// TestGroupCommit checks that concurrent writes share commits.
func TestGroupCommit(t *testing.T) {
	store := kvfault.Wrap(memkv.New())
	b := open(t, store)
	const writers = 64
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				put(t, b, fmt.Sprintf("k%d-%d", i, j), "v")
			}
		}()
	}
	wg.Wait()
	if b.Rev() != 1+writers*20 {
		t.Fatalf("revision %d, want %d", b.Rev(), 1+writers*20)
	}
	if c := store.CommitCalls(); c >= writers*20 {
		t.Fatalf("%d commits for %d writes: no group commit", c, writers*20)
	} else {
		t.Logf("%d writes in %d commits", writers*20, c)
	}
}

// TestSecondWriterIsFenced runs two backends on one store: the one whose view
// is stale must fail its write rather than overwrite.
func TestSecondWriterIsFenced(t *testing.T) {
	store := memkv.New()
	a := open(t, store)
	put(t, a, "k", "1")
	b := open(t, store)
	put(t, a, "k", "2") // b's view of revision and k is now stale
	_, err := b.Put(context.Background(), &pb.PutRequest{Key: []byte("k"), Value: []byte("3")})
	if !errors.Is(err, ErrStoreConflict) {
		t.Fatalf("stale writer: %v", err)
	}
	if kv, _ := get(t, a, "k", 0); string(kv.Value) != "2" {
		t.Fatalf("stale writer overwrote: %q", kv.Value)
	}
}

func TestChangeRecordRoundTrip(t *testing.T) {
	cs := []Change{{Key: []byte("a")}, {Deleted: true, Key: []byte{0, 1, 0xff}, PrevRev: 1 << 40}}
	got, err := decodeChanges(encodeChanges(cs))
	if err != nil || len(got) != 2 || string(got[1].Key) != string(cs[1].Key) || got[1].PrevRev != cs[1].PrevRev || !got[1].Deleted {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for i := range len(encodeChanges(cs)) {
		if _, err := decodeChanges(encodeChanges(cs)[:i]); err == nil {
			t.Fatalf("truncated record of %d bytes decoded", i)
		}
	}
	h := Version{ModRev: 5, CreateRev: 3, Version: 2, Lease: 7, Tombstone: true}
	if got, rest, err := decodeHeader(encodeObject(h, []byte("val"))); err != nil || got != h || string(rest) != "val" {
		t.Fatalf("header round trip: %+v %q %v", got, rest, err)
	}
}

// TestPaginatedCountsStayExact checks the count cache against full scans:
// pages pinned to one revision while writes, deletes and re-creates go on.
func TestPaginatedCountsStayExact(t *testing.T) {
	// badger hands the counting scan record headers only
	// (kv.ScanOptions.ValuePrefix); memkv hands whole values.
	for name, open := range map[string]func(t *testing.T) *Backend{
		"memkv": func(t *testing.T) *Backend { return open(t, memkv.New()) },
		"badger": func(t *testing.T) *Backend {
			s, err := badger.Open(badger.Options{Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return open(t, s)
		},
	} {
		t.Run(name, func(t *testing.T) { testPaginatedCounts(t, open(t)) })
	}
}

func testPaginatedCounts(t *testing.T, b *Backend) {
	ctx := context.Background()
	for i := range 5000 {
		put(t, b, fmt.Sprintf("/p/%05d", i), "v")
	}
	list := func(rev int64, limit int64) (int64, []int64) {
		from := []byte("/p/")
		var counts []int64
		total := int64(0)
		for {
			r, err := b.Range(ctx, &pb.RangeRequest{Key: from, RangeEnd: []byte("/p0"), Limit: limit, Revision: rev})
			if err != nil {
				t.Fatal(err)
			}
			counts = append(counts, r.Count)
			total += int64(len(r.Kvs))
			if rev == 0 {
				// Pin later pages to the first page's revision, as
				// kube-apiserver does.
				rev = r.Header.Revision
			}
			if !r.More {
				return total, counts
			}
			if int64(len(r.Kvs)) != limit {
				t.Fatalf("short page with More set: %d", len(r.Kvs))
			}
			from = append(append([]byte(nil), r.Kvs[len(r.Kvs)-1].Key...), 0)
		}
	}
	rev := b.Rev()
	// Change the range after pinning: the pinned pages must not see it.
	for i := 0; i < 5000; i += 7 {
		del(t, b, fmt.Sprintf("/p/%05d", i))
	}
	put(t, b, "/p/99999", "new")
	total, counts := list(rev, 300)
	if total != 5000 {
		t.Fatalf("pinned list returned %d keys, want 5000", total)
	}
	for i, c := range counts {
		if want := int64(5000 - 300*i); c != want {
			t.Fatalf("page %d count %d, want %d", i, c, want)
		}
	}
	live := int64(5000 - (5000+6)/7 + 1)
	if total, counts := list(0, 300); total != live || counts[0] != live {
		t.Fatalf("current list returned %d keys, first count %d, want %d", total, counts[0], live)
	}
}

// smallBatches refuses batches of more than max ops, as an engine with a
// transaction size limit does.
type smallBatches struct {
	kv.Store
	max int
}

func (s smallBatches) Commit(ctx context.Context, ops []kv.Op) error {
	if len(ops) > s.max {
		return fmt.Errorf("test engine: %d ops: %w", len(ops), kv.ErrBatchTooLarge)
	}
	return s.Store.Commit(ctx, ops)
}

// TestTooLargeTransactionFailsAlone: a delete of more keys than the engine
// can apply atomically fails with ErrTooLarge and writes nothing, and the
// writes that shared its commit group still succeed.
func TestTooLargeTransactionFailsAlone(t *testing.T) {
	b := open(t, smallBatches{Store: memkv.New(), max: 50})
	for i := range 40 {
		put(t, b, fmt.Sprintf("/big/%02d", i), "v")
	}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := b.Put(context.Background(), &pb.PutRequest{Key: []byte(fmt.Sprintf("/small/%d", i)), Value: []byte("v")})
			errs <- err
		}()
	}
	_, delErr := b.DeleteRange(context.Background(), &pb.DeleteRangeRequest{Key: []byte("/big/"), RangeEnd: []byte("/big0")})
	wg.Wait()
	close(errs)
	if !errors.Is(delErr, ErrTooLarge) {
		t.Fatalf("oversized delete: %v, want ErrTooLarge", delErr)
	}
	for err := range errs {
		if err != nil {
			t.Fatalf("a small write sharing the group failed: %v", err)
		}
	}
	r, err := b.Range(context.Background(), &pb.RangeRequest{Key: []byte("/big/"), RangeEnd: []byte("/big0"), CountOnly: true})
	if err != nil || r.Count != 40 {
		t.Fatalf("after the refused delete: count %d, %v", r.Count, err)
	}
	if b.Rev() != 1+40+20 {
		t.Fatalf("revision %d, want %d (dense, the refused delete took none)", b.Rev(), 1+40+20)
	}
}
