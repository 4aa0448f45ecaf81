package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/backup"
	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/migrate"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/core/snapshot"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/etcdtest"
)

// Differential tests of HashKV and snapshots after transactions that change
// one key twice in one revision: etcd's key bucket holds every
// change under its own (main, sub) revision, the superseded ones included,
// until compaction removes them, and HashKV and a snapshot carry them.

// doubleChanges writes, after a seed, every form of transaction that
// changes one key twice that etcd's duplicate-key rule accepts, with plain
// writes between them, and returns the last revision. Each form's keys are
// put just before it, so their earlier versions are there to keep or
// compact. kinds says of each form's revision whether it put a key and then
// deleted it ('A'), deleted a key and then put it again ('B', see
// TestDiffHashKVDoubleChange) or did both ('D').
func doubleChanges(t *testing.T, ctx context.Context, p *pair) (last int64, kinds map[int64]byte) {
	t.Helper()
	forms := []struct {
		what string
		kind byte
		seed []string
		ops  []*pb.RequestOp
	}{
		{"put then from-key delete", 'A', []string{"foo/bar", "foo/baz"}, ops(opPut("foo/bar", "1"), opDel("foo", "\x00"))},
		{"from-key delete then put", 'B', []string{"other/x"}, ops(opDel("other", "\x00"), opPut("other/x", "2"))},
		{"delete, put, delete", 'D', []string{"other/x"}, ops(opDel("other", "\x00"), opPut("other/x", "3"), opDel("other", "\x00"))},
		{"nested put, later nested delete", 'A', []string{"n"}, ops(opTxn(nil, ops(opPut("n", "4")), nil), opTxn(nil, ops(opDel("n", "")), nil))},
		{"from-key delete, then a nested put", 'B', []string{"s/x"}, ops(opDel("s", "\x00"), opTxn(nil, ops(opPut("s/x", "5")), nil))},
		{"nested from-key delete, then put", 'B', []string{"t/x"}, ops(opTxn(nil, ops(opDel("t", "\x00")), nil), opPut("t/x", "6"))},
		{"two puts, then a from-key delete", 'A', []string{"p/a"}, ops(opPut("p/a", "7"), opPut("p/b", "7"), opDel("p", "\x00"))},
		{"put, then a nested from-key delete", 'A', []string{"u/x"}, ops(opPut("u/x", "8"), opTxn(nil, ops(opDel("u", "\x00")), nil))},
		{"put on a new key then from-key delete", 'A', nil, ops(opPut("r/new", "10"), opDel("r", "\x00"))},
	}
	kinds = map[int64]byte{}
	for i, f := range forms {
		p.put(t, ctx, fmt.Sprint("between/", i), "v")
		for _, k := range f.seed {
			p.put(t, ctx, k, fmt.Sprint("before ", i))
		}
		before := p.revision(t, ctx)
		p.ops(t, ctx, f.what, f.ops...)
		rev := p.revision(t, ctx)
		if rev != before+1 {
			t.Fatalf("%s: not accepted (revision %d after %d)", f.what, rev, before)
		}
		kinds[rev] = f.kind
	}
	p.put(t, ctx, "after", "v")
	return p.revision(t, ctx), kinds
}

// revision returns the current revision, the same on both servers.
func (p *pair) revision(t *testing.T, ctx context.Context) int64 {
	t.Helper()
	var rev int64
	same(t, p, "revision", func(i int) (*pb.RangeResponse, error) {
		return p.kv[i].Range(ctx, &pb.RangeRequest{Key: []byte("x")})
	}, func(r *pb.RangeResponse) string { rev = r.Header.Revision; return fmt.Sprint(rev) })
	return rev
}

// TestDiffHashKVDoubleChange: HashKV at every revision equals etcd's after
// each accepted double-change form, before any compaction and after
// compactions at every revision in turn (so at, below and above each
// form's), and after a restart at the compacted revision itself.
//
// A compaction at exactly a revision where a key was deleted and then put
// again is left out: etcd's compaction keeps the delete of such a key and
// removes the put (storage/mvcc/key_index.go, doCompact picks the
// generation the delete ends), although its index still names the put, so
// a later read of the key finds no row and etcd exits. Engram keeps the
// put (README, HashKV).
func TestDiffHashKVDoubleChange(t *testing.T) {
	t.Parallel()
	p, ctx := newRestartablePair(t)
	last, kinds := doubleChanges(t, ctx, p.pair)
	for r := int64(1); r <= last; r++ {
		p.hashKV(t, ctx, r, fmt.Sprintf("at %d, never compacted", r))
		p.everything(t, ctx, fmt.Sprint("everything at ", r), r)
	}
	compacted := int64(0)
	for c := int64(2); c < last; c++ {
		if kinds[c] == 'B' {
			continue
		}
		p.compact(t, ctx, c)
		compacted = c
		// At exactly c a live etcd answers from the hash it kept while
		// compacting (README's deliberate difference): from c+1 on.
		for r := c + 1; r <= last; r++ {
			p.hashKV(t, ctx, r, fmt.Sprintf("at %d, compacted at %d", r, c))
		}
		p.everything(t, ctx, fmt.Sprint("everything, compacted at ", c), 0)
		if t.Failed() {
			return
		}
	}
	p.restart()
	for r := compacted; r <= last; r++ {
		p.hashKV(t, ctx, r, fmt.Sprintf("at %d, compacted at %d, restarted", r, compacted))
	}
}

// snapshotOf saves c's snapshot (Maintenance.Snapshot, as `etcdctl
// snapshot save` does) to a file and returns its path.
func snapshotOf(t *testing.T, ctx context.Context, c *clientv3.Client, name string) string {
	t.Helper()
	rc, err := c.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	path := filepath.Join(t.TempDir(), name)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func dialEndpoint(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// doubleChangeSetup is a real etcd and an Engram, each with a client, and
// the pair of them, for the double-change tests.
type doubleChangeSetup struct {
	ctx    context.Context
	etcd   *etcdtest.Etcd
	ec, gc *clientv3.Client
	p      *restartablePair
}

func newDoubleChangeSetup(t *testing.T) doubleChangeSetup {
	t.Helper()
	etcdtest.Require(t)
	// A hang guard, not a measurement.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	e := etcdtest.Start(t, etcdtest.Options{})
	ec := dialEndpoint(t, e.Endpoint)
	gc := servertest.Start(t, memkv.New(), servertest.Options{}).Client(t)
	return doubleChangeSetup{ctx: ctx, etcd: e, ec: ec, gc: gc, p: hashPair([2]string{"etcd", "engram"}, [2]*clientv3.Client{ec, gc})}
}

// hashPair is a pair with Maintenance clients, for hashKV.
func hashPair(names [2]string, cs [2]*clientv3.Client) *restartablePair {
	p := &restartablePair{pair: &pair{names: names}}
	for i, c := range cs {
		p.kv[i] = pb.NewKVClient(c.ActiveConnection())
		p.lease[i] = pb.NewLeaseClient(c.ActiveConnection())
		p.watch[i] = pb.NewWatchClient(c.ActiveConnection())
		p.maint[i] = pb.NewMaintenanceClient(c.ActiveConnection())
	}
	return p
}

// TestDiffSnapshotDoubleChange: after the double-change forms, compacted
// first where one key was deleted, put and deleted again in one
// transaction, then where one was put and then deleted, Engram's snapshot
// holds etcd's key-bucket rows, and both ways through a snapshot keep what
// etcd keeps: Engram's snapshot restored by etcdutl and etcd's snapshot
// restored into Engram each answer HashKV and Range at every revision as
// the etcd that wrote the history does.
func TestDiffSnapshotDoubleChange(t *testing.T) {
	t.Parallel()
	d := newDoubleChangeSetup(t)
	ctx, ec, gc, p := d.ctx, d.ec, d.gc, d.p
	last, kinds := doubleChanges(t, ctx, p.pair)
	var compactions []int64
	for _, kind := range []byte{'D', 'A'} {
		for r := last; r > 0; r-- {
			if kinds[r] == kind {
				compactions = append(compactions, r)
				break
			}
		}
	}
	if len(compactions) != 2 || compactions[0] >= compactions[1] {
		t.Fatalf("compactions %v: want a 'D' form before the last 'A' form", compactions)
	}
	for _, c := range compactions {
		p.compact(t, ctx, c)
		check := func(t *testing.T, q *restartablePair, what string) {
			t.Helper()
			for r := c + 1; r <= last; r++ {
				q.hashKV(t, ctx, r, fmt.Sprintf("%s at %d", what, r))
				q.everything(t, ctx, fmt.Sprintf("%s: everything at %d", what, r), r)
			}
			q.everything(t, ctx, what+": everything at the compacted revision", c)
			q.replay(t, ctx, what, c+1, "after")
		}
		etcdSnap := snapshotOf(t, ctx, ec, "etcd.db")
		engramSnap := snapshotOf(t, ctx, gc, "engram.db")
		t.Run(fmt.Sprint("compacted at ", c), func(t *testing.T) {
			t.Run("key bucket", func(t *testing.T) { sameRows(t, etcdSnap, engramSnap) })
			t.Run("engram snapshot restored into etcd", func(t *testing.T) {
				restored := etcdtest.Start(t, etcdtest.Options{DataDir: etcdtest.Restore(t, engramSnap)})
				check(t, hashPair([2]string{"etcd", "etcd restored from engram"}, [2]*clientv3.Client{ec, dialEndpoint(t, restored.Endpoint)}), "restored etcd")
			})
			t.Run("etcd snapshot restored into engram", func(t *testing.T) {
				store := memkv.New()
				t.Cleanup(func() { _ = store.Close() })
				if _, err := backup.Restore(ctx, store, etcdSnap, backup.RestoreOptions{}); err != nil {
					t.Fatal(err)
				}
				g := servertest.Start(t, store, servertest.Options{}).Client(t)
				check(t, hashPair([2]string{"etcd", "engram restored from etcd"}, [2]*clientv3.Client{ec, g}), "restored engram")
				sameRows(t, etcdSnap, snapshotOf(t, ctx, g, "again.db"))
			})
		})
	}
}

// replay compares a watch of every key from revision from, with prev_kv,
// up to the first event of key last.
func (p *pair) replay(t *testing.T, ctx context.Context, what string, from int64, last string) {
	t.Helper()
	w := p.watchStreams(t, ctx)
	w.exchange(t, p, what+": watch everything from "+fmt.Sprint(from), createWatch(&pb.WatchCreateRequest{Key: []byte{0}, RangeEnd: []byte{0}, StartRevision: from, PrevKv: true}))
	same(t, p, what+": replayed events", func(i int) ([]string, error) {
		var evs []string
		for {
			r, err := w[i].Recv()
			if err != nil {
				return nil, err
			}
			for _, e := range r.Events {
				evs = append(evs, fmt.Sprintf("%s %s prev=%s", e.Type, showKVs([]*mvccpb.KeyValue{e.Kv}), showKVs([]*mvccpb.KeyValue{e.PrevKv})))
				if string(e.Kv.Key) == last {
					return evs, nil
				}
			}
		}
	}, func(evs []string) string { return strings.Join(evs, "\n") })
	for i := range w {
		_ = w[i].CloseSend()
	}
}

// sameRows compares the key-bucket rows of etcd's snapshot and Engram's.
func sameRows(t *testing.T, etcdSnap, engramSnap string) {
	t.Helper()
	want, got := bucketRows(t, etcdSnap), bucketRows(t, engramSnap)
	for i := range max(len(want), len(got)) {
		var w, g string
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			t.Errorf("key-bucket row %d:\n  etcd:   %s\n  engram: %s", i, w, g)
		}
	}
}

// bucketRows returns a snapshot's key-bucket rows as etcd stores them.
func bucketRows(t *testing.T, path string) []string {
	t.Helper()
	f, err := snapshot.Open(path, snapshot.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []string
	err = f.Entries(t.Context(), func(e *etcdfmt.Entry) error {
		rows = append(rows, fmt.Sprintf("%x %x", e.BucketKey(), e.BucketValue()))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestDiffMigrateDoubleChange: a migration from etcd carries the
// double-change forms both ways it reads them, from the base snapshot
// (compacted where a key was deleted, put and deleted again) and from the
// watch it follows afterwards, and the migrated store answers HashKV, Range
// and a replayed watch as etcd does.
func TestDiffMigrateDoubleChange(t *testing.T) {
	t.Parallel()
	d := newDoubleChangeSetup(t)
	ctx, e, ec, p := d.ctx, d.etcd, d.ec, d.p
	_, kinds := doubleChanges(t, ctx, p.pair)
	var compactAt int64
	for r, k := range kinds {
		if k == 'D' {
			compactAt = r
		}
	}
	p.compact(t, ctx, compactAt)

	store := memkv.New()
	t.Cleanup(func() { _ = store.Close() })
	following, cutover := make(chan struct{}), make(chan struct{})
	type outcome struct {
		res migrate.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := migrate.Run(ctx, migrate.Options{Client: ec, Source: e.ClientURL, Store: store, TempDir: t.TempDir(),
			Logger: slog.New(slog.DiscardHandler), Following: func(int64) { close(following) }}, cutover)
		done <- outcome{res, err}
	}()
	select {
	case <-following:
	case o := <-done:
		t.Fatalf("migration ended before following: %+v, %v", o.res, o.err)
	case <-ctx.Done():
		t.Fatal("the migration never followed")
	}
	last, _ := doubleChanges(t, ctx, p.pair)
	close(cutover)
	o := <-done
	if o.err != nil {
		t.Fatalf("migration: %v", o.err)
	}
	if o.res.Rev != last || o.res.BaseRev >= last {
		t.Fatalf("migration %+v, want a base below revision %d and the target at it", o.res, last)
	}
	t.Logf("migrated: %+v", o.res)
	g := servertest.Start(t, store, servertest.Options{}).Client(t)
	q := hashPair([2]string{"etcd", "migrated engram"}, [2]*clientv3.Client{ec, g})
	for r := compactAt + 1; r <= last; r++ {
		q.hashKV(t, ctx, r, fmt.Sprint("migrated at ", r))
		q.everything(t, ctx, fmt.Sprint("migrated: everything at ", r), r)
	}
	q.replay(t, ctx, "migrated", compactAt+1, "after")
	sameRows(t, snapshotOf(t, ctx, ec, "etcd.db"), snapshotOf(t, ctx, g, "migrated.db"))
}
