package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/golang/protobuf/proto"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/memkv"
)

// churn runs a seeded random workload shaped like the Kubernetes registry:
// creates, updates, multi-key transactions (sub revisions > 0), prefix
// deletes, re-creates, keys on leases and a revoked lease. It compacts at
// the middle revision, so the export has sparse history below it, and
// returns the compacted revision.
func churn(t *testing.T, b *mvcc.Backend, seed uint64, ops int) int64 {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, seed))
	key := func() []byte { return fmt.Appendf(nil, "/registry/pods/ns%d/p%02d", rng.IntN(3), rng.IntN(25)) }
	val := func() []byte { return fmt.Appendf(nil, "v%d-%x", rng.IntN(1000), rng.Uint64()) }
	for _, id := range []int64{101, 102, 103} {
		if _, err := b.GrantLease(ctx, id, 600); err != nil {
			t.Fatal(err)
		}
	}
	put := func(k, v []byte, lease int64) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: k, Value: v, Lease: lease}}}
	}
	var compacted int64
	leases := 3
	for i := range ops {
		var req *pb.TxnRequest
		switch n := rng.IntN(10); {
		case n < 5:
			req = &pb.TxnRequest{Success: []*pb.RequestOp{put(key(), val(), 0)}}
		case n < 7:
			// Distinct keys: etcd refuses a key twice in one transaction.
			seen := map[string]bool{}
			req = &pb.TxnRequest{}
			for range 2 + rng.IntN(3) {
				k := key()
				if seen[string(k)] {
					continue
				}
				seen[string(k)] = true
				req.Success = append(req.Success, put(k, val(), 0))
			}
		case n < 8:
			k := key()
			req = &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: k[:len(k)-1], RangeEnd: append(k[:len(k)-1:len(k)-1], k[len(k)-1]+1)}}}}}
		case n < 9:
			req = &pb.TxnRequest{Success: []*pb.RequestOp{put(key(), val(), 101+int64(rng.IntN(leases)))}}
		default:
			req = &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: key()}}}}}
		}
		if _, err := b.Txn(ctx, req); err != nil {
			t.Fatal(err)
		}
		if i == ops/2 {
			if _, err := b.RevokeLease(ctx, 103); err != nil {
				t.Fatal(err)
			}
			leases = 2
			compacted = b.Rev() - 3
			if _, err := b.Compact(ctx, compacted, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	return compacted
}

// transfer exports src at its current revision into a fresh store through
// the sorter, as restore does, keeping only keys with prefix.
func transfer(t *testing.T, src *mvcc.Backend, dst kv.Store, prefix []byte) {
	t.Helper()
	ctx := context.Background()
	sorter := etcdfmt.NewSorter(t.TempDir(), 4<<10) // small: force runs on disk
	defer sorter.Close()
	info, err := Export(ctx, src, 0, func(e *etcdfmt.Entry) error {
		if !bytes.HasPrefix(e.KV.Key, prefix) {
			return nil
		}
		return sorter.Add(e)
	})
	if err != nil {
		t.Fatal(err)
	}
	im, err := NewImporter(ctx, ImportOptions{Store: dst, Record: mvcc.ImportRecord{Kind: "restore", Source: t.Name(), CompactRev: info.CompactRev}, MaxBatchBytes: 2 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range info.Leases {
		if err := im.Lease(l.ID, l.TTL); err != nil {
			t.Fatal(err)
		}
	}
	if err := sorter.Each(ctx, func(e *etcdfmt.Entry) error { return im.Add(ctx, e) }); err != nil {
		t.Fatal(err)
	}
	if err := im.Finish(ctx, FinishOptions{Rev: info.Rev, CompactRev: info.CompactRev}); err != nil {
		t.Fatal(err)
	}
}

func rangeAt(t *testing.T, b *mvcc.Backend, prefix []byte, rev int64) []*mvccpb.KeyValue {
	t.Helper()
	key, end := []byte{0}, []byte{0}
	if len(prefix) > 0 {
		key, end = prefix, append(append([]byte(nil), prefix[:len(prefix)-1]...), prefix[len(prefix)-1]+1)
	}
	r, err := b.Range(context.Background(), &pb.RangeRequest{Key: key, RangeEnd: end, Revision: rev})
	if err != nil {
		t.Fatalf("range at %d: %v", rev, err)
	}
	return r.Kvs
}

func sameKVs(a, b []*mvccpb.KeyValue) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// TestExportImportRoundTrip moves a compacted store's history through
// Export, the sorter and the Importer, and checks that the copy answers
// like the original: reads at every revision the original still serves,
// the watch history from the compacted revision, leases, and HashKV.
func TestExportImportRoundTrip(t *testing.T) {
	ctx := context.Background()
	src := open(t, memkv.New())
	compacted := churn(t, src, 7, 300)
	// etcd grants a lease ID the client chose, negative ones included; the
	// copy must keep it like any other.
	if _, err := src.GrantLease(ctx, -42, 600); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Put(ctx, &pb.PutRequest{Key: []byte("/registry/negative-lease"), Value: []byte("v"), Lease: -42}); err != nil {
		t.Fatal(err)
	}
	dstStore := memkv.New()
	transfer(t, src, dstStore, nil)
	dst := open(t, dstStore)
	if keys := dst.Lessor().Keys(-42); len(keys) != 1 {
		t.Fatalf("lease -42 holds %d keys in the copy, want 1", len(keys))
	}

	if dst.Rev() != src.Rev() || dst.CompactRev() != src.CompactRev() {
		t.Fatalf("copy at revision %d compacted %d, original at %d compacted %d", dst.Rev(), dst.CompactRev(), src.Rev(), src.CompactRev())
	}
	for rev := compacted; rev <= src.Rev(); rev++ {
		if a, b := rangeAt(t, src, nil, rev), rangeAt(t, dst, nil, rev); !sameKVs(a, b) {
			t.Fatalf("range at %d differs:\noriginal %v\ncopy     %v", rev, a, b)
		}
	}
	sameHashesAndEvents(t, "round trip", src, dst, compacted)
	if a, b := src.Lessor().Keys(101), dst.Lessor().Keys(101); len(a) != len(b) {
		t.Fatalf("lease 101 holds %d keys in the original, %d in the copy", len(a), len(b))
	}
	if dst.Lessor().Known(103) {
		t.Fatal("the revoked lease 103 came back in the copy")
	}
	// The copy keeps working as a store: the next write takes the next
	// revision.
	if r := put(t, dst, "/registry/next", "x"); r != src.Rev()+1 {
		t.Fatalf("first write after the import at revision %d, want %d", r, src.Rev()+1)
	}
}

// TestImportPrefix imports only part of the keyspace: history has gaps
// (other keys' revisions), which the change log fills, and the copy resumes
// at the original's revision so no client sees a revision go backwards.
func TestImportPrefix(t *testing.T) {
	ctx := context.Background()
	src := open(t, memkv.New())
	compacted := churn(t, src, 11, 200)
	prefix := []byte("/registry/pods/ns1/")
	dstStore := memkv.New()
	transfer(t, src, dstStore, prefix)
	dst := open(t, dstStore)
	if dst.Rev() != src.Rev() {
		t.Fatalf("prefix copy at revision %d, want the original's %d", dst.Rev(), src.Rev())
	}
	for rev := compacted; rev <= src.Rev(); rev++ {
		if a, b := rangeAt(t, src, prefix, rev), rangeAt(t, dst, prefix, rev); !sameKVs(a, b) {
			t.Fatalf("range of %s at %d differs:\noriginal %v\ncopy     %v", prefix, rev, a, b)
		}
	}
	evs, _, err := dst.Events(ctx, compacted, dst.Rev(), 1<<30)
	if err != nil {
		t.Fatalf("watch history of the prefix copy: %v", err)
	}
	for _, ev := range evs {
		if !bytes.HasPrefix(ev.Kv.Key, prefix) {
			t.Fatalf("event of %q outside the prefix", ev.Kv.Key)
		}
	}
}

// TestImportRefusesAndGuards checks the import's safety rules: a store with
// data is refused, a half-done import is never served, and a new import of
// the same kind starts over cleanly.
func TestImportRefusesAndGuards(t *testing.T) {
	ctx := context.Background()
	used := memkv.New()
	b := open(t, used)
	put(t, b, "a", "1")
	if _, err := NewImporter(ctx, ImportOptions{Store: used, Record: mvcc.ImportRecord{Kind: "restore", Source: "x"}}); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("import into a store with data: %v, want ErrNotEmpty", err)
	}

	half := memkv.New()
	im, err := NewImporter(ctx, ImportOptions{Store: half, Record: mvcc.ImportRecord{Kind: "restore", Source: "first"}})
	if err != nil {
		t.Fatal(err)
	}
	row := etcdfmt.Entry{Rev: etcdfmt.Revision{Main: 2}}
	row.KV = etcdfmt.KeyValue{Key: []byte("k"), CreateRevision: 2, ModRevision: 2, Version: 1, Value: []byte("v")}
	if err := im.Add(ctx, &row); err != nil {
		t.Fatal(err)
	}
	if err := im.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := mvcc.Open(ctx, mvcc.Options{Store: half}); !errors.Is(err, mvcc.ErrImportUnfinished) {
		t.Fatalf("opening a half-imported store: %v, want mvcc.ErrImportUnfinished", err)
	}
	if _, err := NewImporter(ctx, ImportOptions{Store: half, Record: mvcc.ImportRecord{Kind: "migrate", Source: "y"}}); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("a migration over an unfinished restore: %v, want ErrNotEmpty", err)
	}
	// A restore again wipes the unfinished one.
	im, err = NewImporter(ctx, ImportOptions{Store: half, Record: mvcc.ImportRecord{Kind: "restore", Source: "second"}})
	if err != nil {
		t.Fatal(err)
	}
	row.Rev.Main, row.KV.CreateRevision, row.KV.ModRevision, row.KV.Value = 5, 5, 5, []byte("w")
	if err := im.Add(ctx, &row); err != nil {
		t.Fatal(err)
	}
	if err := im.Finish(ctx, FinishOptions{Rev: 5}); err != nil {
		t.Fatal(err)
	}
	nb := open(t, half)
	kv, err := get(t, nb, "k", 0)
	if err != nil || kv == nil || string(kv.Value) != "w" || kv.CreateRevision != 5 || nb.Rev() != 5 {
		t.Fatalf("after the second restore: %v %v at revision %d", kv, err, nb.Rev())
	}

	// Rows out of order are refused.
	bad := memkv.New()
	im, err = NewImporter(ctx, ImportOptions{Store: bad, Record: mvcc.ImportRecord{Kind: "restore", Source: "z"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := im.Add(ctx, &row); err != nil {
		t.Fatal(err)
	}
	row.Rev.Main = 4
	if err := im.Add(ctx, &row); err == nil {
		t.Fatal("a row below the previous one was accepted")
	}
}

// TestImportResume interrupts an import between batches and resumes it.
func TestImportResume(t *testing.T) {
	ctx := context.Background()
	src := open(t, memkv.New())
	churn(t, src, 3, 120)
	var rows []etcdfmt.Entry
	sorter := etcdfmt.NewSorter(t.TempDir(), 0)
	defer sorter.Close()
	info, err := Export(ctx, src, 0, func(e *etcdfmt.Entry) error { return sorter.Add(e) })
	if err != nil {
		t.Fatal(err)
	}
	if err := sorter.Each(ctx, func(e *etcdfmt.Entry) error {
		c := *e
		c.KV.Key, c.KV.Value = bytes.Clone(e.KV.Key), bytes.Clone(e.KV.Value)
		rows = append(rows, c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	dstStore := memkv.New()
	rec := mvcc.ImportRecord{Kind: "migrate", Source: "src", CompactRev: info.CompactRev}
	im, err := NewImporter(ctx, ImportOptions{Store: dstStore, Record: rec, Resume: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range info.Leases {
		if err := im.Lease(l.ID, l.TTL); err != nil {
			t.Fatal(err)
		}
	}
	half := len(rows) / 2
	for half < len(rows) && rows[half].Rev.Main == rows[half-1].Rev.Main {
		half++
	}
	for i := range rows[:half] {
		if err := im.Add(ctx, &rows[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := im.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The process stops here; a new one resumes.
	im, err = NewImporter(ctx, ImportOptions{Store: dstStore, Record: rec, Resume: true})
	if err != nil {
		t.Fatal(err)
	}
	if !im.Resumed() || im.Record().Applied != rows[half-1].Rev.Main {
		t.Fatalf("resumed %v at %d, want at %d", im.Resumed(), im.Record().Applied, rows[half-1].Rev.Main)
	}
	for i := range rows[half:] {
		if err := im.Add(ctx, &rows[half+i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := im.Finish(ctx, FinishOptions{Rev: info.Rev, CompactRev: info.CompactRev}); err != nil {
		t.Fatal(err)
	}
	dst := open(t, dstStore)
	for rev := info.CompactRev; rev <= info.Rev; rev++ {
		ha, _ := HashKV(ctx, src, rev)
		hb, _ := HashKV(ctx, dst, rev)
		if ha != hb {
			t.Fatalf("HashKV at %d after a resumed import: %+v vs %+v", rev, ha, hb)
		}
	}
}

// TestExportConsistentUnderWrites exports while writers move versions from
// the latest records into history: the rows of an export at revision R must
// be exactly those of a later, quiet export at R (none lost, none twice).
func TestExportConsistentUnderWrites(t *testing.T) {
	ctx := context.Background()
	b := open(t, memkv.New())
	churn(t, b, 5, 150)
	stop := make(chan struct{})
	done := make(chan error, 4)
	for w := range 4 {
		go func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for i := 0; ; i++ {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				k := fmt.Appendf(nil, "/registry/pods/ns%d/p%02d", rng.IntN(3), rng.IntN(25))
				var err error
				if i%5 == 4 {
					_, err = b.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: k})
				} else {
					_, err = b.Put(ctx, &pb.PutRequest{Key: k, Value: fmt.Appendf(nil, "w%d-%d", w, i)})
				}
				if err != nil {
					done <- err
					return
				}
			}
		}()
	}
	rowsOf := func(rev int64) (map[etcdfmt.Revision]string, ExportInfo) {
		rows := map[etcdfmt.Revision]string{}
		info, err := Export(ctx, b, rev, func(e *etcdfmt.Entry) error {
			if _, dup := rows[e.Rev]; dup {
				t.Fatalf("revision %d/%d exported twice", e.Rev.Main, e.Rev.Sub)
			}
			rows[e.Rev] = fmt.Sprintf("%q %v %v", e.KV.Key, e.Tombstone, e.KV.Proto().String())
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return rows, info
	}
	var during []map[etcdfmt.Revision]string
	var infos []ExportInfo
	for range 5 {
		rows, info := rowsOf(0)
		during, infos = append(during, rows), append(infos, info)
	}
	close(stop)
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for i, info := range infos {
		quiet, _ := rowsOf(info.Rev)
		if len(quiet) != len(during[i]) {
			t.Fatalf("export at %d under writes: %d rows; quiet export at %d: %d rows", info.Rev, len(during[i]), info.Rev, len(quiet))
		}
		for r, row := range quiet {
			if during[i][r] != row {
				t.Fatalf("export at %d: revision %d/%d is %s under writes, %s when quiet", info.Rev, r.Main, r.Sub, during[i][r], row)
			}
		}
	}
}

// scanHook runs hook before the first scan of a space opens.
type scanHook struct {
	kv.Store
	space byte
	hook  func()
}

func (s *scanHook) Scan(ctx context.Context, opts kv.ScanOptions) (kv.Iterator, error) {
	if s.hook != nil && len(opts.Start) == 4 && opts.Start[3] == s.space {
		h := s.hook
		s.hook = nil
		h()
	}
	return s.Store.Scan(ctx, opts)
}

// TestExportVersionMovedBetweenSnapshots: a write lands after the export's
// snapshot of the latest records and before its snapshot of history, so the
// version it replaces is in both snapshots; it must be exported once.
func TestExportVersionMovedBetweenSnapshots(t *testing.T) {
	ctx := context.Background()
	hooked := &scanHook{Store: memkv.New(), space: 'o'}
	b := open(t, hooked)
	put(t, b, "a", "1")
	put(t, b, "b", "1")
	put(t, b, "a", "2")
	rev := b.Rev()
	hooked.hook = func() { put(t, b, "b", "2") } // moves b@3 into history
	rows := map[etcdfmt.Revision]int{}
	info, err := Export(ctx, b, 0, func(e *etcdfmt.Entry) error {
		rows[e.Rev]++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if info.Rev != rev {
		t.Fatalf("export at %d, want %d (the write came after it started)", info.Rev, rev)
	}
	want := map[etcdfmt.Revision]int{{Main: 2}: 1, {Main: 3}: 1, {Main: 4}: 1}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Fatalf("exported revisions %v, want each of %v once", rows, want)
	}
}
