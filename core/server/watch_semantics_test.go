package server_test

import (
	"errors"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestWatchSemantics(t *testing.T) {
	t.Parallel()
	c, ctx := setup(t)
	must(c.Put(ctx, "/w/a", "1"))(t) // 2
	must(c.Put(ctx, "/w/b", "1"))(t) // 3
	must(c.Put(ctx, "/x", "1"))(t)   // 4
	must(c.Put(ctx, "/w/a", "2"))(t) // 5
	must(c.Delete(ctx, "/w/b"))(t)   // 6
	wch := c.Watch(ctx, "/w/", clientv3.WithPrefix(), clientv3.WithRev(2), clientv3.WithPrevKV())
	want := []struct {
		typ     mvccpb.Event_EventType
		key     string
		rev     int64
		create  bool
		prevVal string
	}{
		{mvccpb.PUT, "/w/a", 2, true, ""},
		{mvccpb.PUT, "/w/b", 3, true, ""},
		{mvccpb.PUT, "/w/a", 5, false, "1"},
		{mvccpb.DELETE, "/w/b", 6, false, "1"},
		{mvccpb.PUT, "/w/c", 8, true, ""},
	}
	must(c.Put(ctx, "/y", "1"))(t)   // 7
	must(c.Put(ctx, "/w/c", "1"))(t) // 8
	var got []*clientv3.Event
	for len(got) < len(want) {
		select {
		case wr := <-wch:
			if err := wr.Err(); err != nil {
				t.Fatal(err)
			}
			got = append(got, wr.Events...)
		case <-ctx.Done():
			t.Fatalf("timed out after %d events", len(got))
		}
	}
	for i, w := range want {
		ev := got[i]
		if ev.Type != w.typ || string(ev.Kv.Key) != w.key || ev.Kv.ModRevision != w.rev || ev.IsCreate() != w.create {
			t.Errorf("event %d: %v %q rev %d create %v; want %+v", i, ev.Type, ev.Kv.Key, ev.Kv.ModRevision, ev.IsCreate(), w)
		}
		if w.prevVal != "" && (ev.PrevKv == nil || string(ev.PrevKv.Value) != w.prevVal) {
			t.Errorf("event %d: prev kv %+v", i, ev.PrevKv)
		}
	}
	if len(got) > len(want) {
		t.Errorf("extra events: %d", len(got)-len(want))
	}
}

func TestWatchProgressAndCompaction(t *testing.T) {
	t.Parallel()
	c, ctx, clk := setupClock(t)
	must(c.Put(ctx, "a", "1"))(t)
	wctx := clientv3.WithRequireLeader(ctx)
	wch := c.Watch(wctx, "zzz", clientv3.WithProgressNotify())
	// Periodic progress notification: the first comes one interval after
	// the watch started.
	clk.WaitArmed(clk.Now().Add(progressInterval))
	clk.Advance(progressInterval)
	select {
	case wr := <-wch:
		if !wr.IsProgressNotify() || wr.Header.Revision != 2 {
			t.Fatalf("want progress notify at 2, got %+v", wr)
		}
	case <-ctx.Done():
		t.Fatal("no progress notification")
	}
	must(c.Put(ctx, "b", "1"))(t)
	if err := c.RequestProgress(wctx); err != nil {
		t.Fatal(err)
	}
	for {
		wr := <-wch
		if wr.IsProgressNotify() && wr.Header.Revision == 3 {
			break
		}
		if wr.Err() != nil {
			t.Fatal(wr.Err())
		}
	}
	must(c.Put(ctx, "a", "2"))(t)
	must(c.Compact(ctx, 4))(t)
	old := c.Watch(ctx, "a", clientv3.WithRev(2))
	wr := <-old
	if wr.CompactRevision != 4 || !errors.Is(wr.Err(), rpctypes.ErrCompacted) {
		t.Fatalf("watch below compaction: compact=%d err=%v", wr.CompactRevision, wr.Err())
	}
}

// TestWatchAtCompactedRevisionHasNoPrevKV matches etcd: the previous version
// of an event at exactly the compacted revision is compacted, so prev_kv is
// absent (kube-apiserver turns that into an error and relists), while the
// next event has it.
func TestWatchAtCompactedRevisionHasNoPrevKV(t *testing.T) {
	t.Parallel()
	c, ctx := setup(t)
	must(c.Put(ctx, "k", "1"))(t) // 2
	must(c.Put(ctx, "k", "2"))(t) // 3
	must(c.Put(ctx, "k", "3"))(t) // 4
	must(c.Compact(ctx, 3, clientv3.WithCompactPhysical()))(t)
	wch := c.Watch(ctx, "k", clientv3.WithRev(3), clientv3.WithPrevKV())
	var evs []*clientv3.Event
	for len(evs) < 2 {
		wr := <-wch
		if err := wr.Err(); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, wr.Events...)
	}
	if evs[0].Kv.ModRevision != 3 || evs[0].PrevKv != nil {
		t.Errorf("event at the compacted revision: prev_kv %+v, want none", evs[0].PrevKv)
	}
	if evs[1].PrevKv == nil || string(evs[1].PrevKv.Value) != "2" {
		t.Errorf("event after the compacted revision: prev_kv %+v", evs[1].PrevKv)
	}
	// Deleted exactly at the compacted revision, then re-created.
	must(c.Delete(ctx, "k"))(t) // 5
	must(c.Compact(ctx, 5, clientv3.WithCompactPhysical()))(t)
	if r := must(c.Get(ctx, "k", clientv3.WithRev(5)))(t); len(r.Kvs) != 0 {
		t.Errorf("key deleted at the compacted revision is readable there")
	}
	must(c.Put(ctx, "k", "new"))(t) // 6
	must(c.Compact(ctx, 6, clientv3.WithCompactPhysical()))(t)
	if r := must(c.Get(ctx, "k"))(t); r.Kvs[0].CreateRevision != 6 || r.Kvs[0].Version != 1 {
		t.Errorf("re-created key: %+v", r.Kvs[0])
	}
}
