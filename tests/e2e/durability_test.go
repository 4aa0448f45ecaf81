package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// collectEvents reads n events from a watch, waiting at most 30s.
func collectEvents(ctx context.Context, t *testing.T, wch clientv3.WatchChan, n int) []*clientv3.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got []*clientv3.Event
	for len(got) < n {
		select {
		case resp, ok := <-wch:
			if !ok {
				t.Fatalf("watch closed after %d of %d events (ctx: %v)", len(got), n, ctx.Err())
			}
			if err := resp.Err(); err != nil {
				t.Fatalf("watch after %d of %d events: %v", len(got), n, err)
			}
			got = append(got, resp.Events...)
		case <-ctx.Done():
			t.Fatalf("watch: %d of %d events before the deadline", len(got), n)
		}
	}
	if len(got) > n {
		t.Fatalf("watch: %d events, want %d", len(got), n)
	}
	return got
}

func eventString(e *clientv3.Event) string {
	return fmt.Sprintf("%v %s=%q create=%d mod=%d version=%d lease=%x",
		e.Type, e.Kv.Key, e.Kv.Value, e.Kv.CreateRevision, e.Kv.ModRevision, e.Kv.Version, e.Kv.Lease)
}

func kvString(kv *mvccpb.KeyValue) string {
	return fmt.Sprintf("%s=%q create=%d mod=%d version=%d lease=%x",
		kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
}

func kvStrings(kvs []*mvccpb.KeyValue) []string {
	var out []string
	for _, kv := range kvs {
		out = append(out, kvString(kv))
	}
	return out
}

// TestRestartKeepsState writes keys, history and a lease, stops engram with
// SIGTERM and starts it again on the same data directory: everything a
// client could observe before must be observable after, including watching
// from a revision before the restart.
func TestRestartKeepsState(t *testing.T) {
	t.Parallel()
	n := startNode(t, nodeOptions{})
	ctx := testCtx(t, 2*time.Minute)
	cli := n.client(t)

	lease, err := cli.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() (*clientv3.TxnResponse, error){
		func() (*clientv3.TxnResponse, error) { return cli.Txn(ctx).Then(clientv3.OpPut("r/a", "1")).Commit() },
		func() (*clientv3.TxnResponse, error) { return cli.Txn(ctx).Then(clientv3.OpPut("r/b", "1")).Commit() },
		func() (*clientv3.TxnResponse, error) { return cli.Txn(ctx).Then(clientv3.OpPut("r/a", "2")).Commit() },
		func() (*clientv3.TxnResponse, error) {
			return cli.Txn(ctx).Then(clientv3.OpPut("r/leased", "v", clientv3.WithLease(lease.ID))).Commit()
		},
		func() (*clientv3.TxnResponse, error) { return cli.Txn(ctx).Then(clientv3.OpDelete("r/b")).Commit() },
		func() (*clientv3.TxnResponse, error) {
			return cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision("r/c"), "=", 0)).
				Then(clientv3.OpPut("r/c", "created")).Commit()
		},
	} {
		if _, err := step(); err != nil {
			t.Fatal(err)
		}
	}
	before, err := cli.Get(ctx, "r/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if before.Header.Revision != 7 {
		t.Fatalf("revision after six writes on a fresh store: %d, want 7", before.Header.Revision)
	}
	wctx, wcancel := context.WithCancel(ctx)
	history := collectEvents(ctx, t, cli.Watch(wctx, "r/", clientv3.WithPrefix(), clientv3.WithRev(2)), 6)
	wcancel()

	// Close the client so no stream holds the graceful stop open.
	cli.Close()
	n.stop()
	n.restart()
	cli = n.client(t)

	after, err := cli.Get(ctx, "r/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision {
		t.Errorf("revision after restart %d, want %d", after.Header.Revision, before.Header.Revision)
	}
	if got, want := kvStrings(after.Kvs), kvStrings(before.Kvs); !slices.Equal(got, want) {
		t.Errorf("keys after restart:\n got %q\nwant %q", got, want)
	}

	ttl, err := cli.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	if ttl.GrantedTTL != 600 || ttl.TTL <= 0 || len(ttl.Keys) != 1 || string(ttl.Keys[0]) != "r/leased" {
		t.Errorf("lease after restart: granted %d remaining %d keys %q; want 600, > 0, [r/leased]", ttl.GrantedTTL, ttl.TTL, ttl.Keys)
	}
	if _, err := cli.KeepAliveOnce(ctx, lease.ID); err != nil {
		t.Errorf("keep-alive of a lease granted before the restart: %v", err)
	}

	// A watch from a pre-restart revision replays the same history, then
	// continues with new writes at the next revision.
	wch := cli.Watch(ctx, "r/", clientv3.WithPrefix(), clientv3.WithRev(2))
	replay := collectEvents(ctx, t, wch, 6)
	for i := range history {
		if got, want := eventString(replay[i]), eventString(history[i]); got != want {
			t.Errorf("replayed event %d:\n got %s\nwant %s", i, got, want)
		}
	}
	put, err := cli.Put(ctx, "r/new", "after")
	if err != nil {
		t.Fatal(err)
	}
	if put.Header.Revision != before.Header.Revision+1 {
		t.Errorf("first write after restart at revision %d, want %d", put.Header.Revision, before.Header.Revision+1)
	}
	live := collectEvents(ctx, t, wch, 1)
	if e := live[0]; e.Type != mvccpb.PUT || string(e.Kv.Key) != "r/new" || e.Kv.ModRevision != put.Header.Revision {
		t.Errorf("live event after replay: %s", eventString(e))
	}
}

// ack is one write the server acknowledged.
type ack struct {
	key   string
	value string
	rev   int64
}

// TestCrashLosesNoAcknowledgedWrite kills engram with SIGKILL in the middle
// of a concurrent create load. After restart every acknowledged create must
// be there at the revision it was acknowledged with, and revisions must be
// dense: a revision is never handed out and then lost.
func TestCrashLosesNoAcknowledgedWrite(t *testing.T) {
	t.Parallel()
	interruptWriteLoad(t, (*node).kill)
}

// TestStopUnderLoadLosesNoAcknowledgedWrite is the same with SIGTERM: the
// graceful path must also finish or refuse every in-flight write, and exit 0.
func TestStopUnderLoadLosesNoAcknowledgedWrite(t *testing.T) {
	t.Parallel()
	interruptWriteLoad(t, (*node).stop)
}

// interruptWriteLoad runs 8 concurrent creators, interrupts engram with
// interrupt mid-load, restarts it and checks what survived.
func interruptWriteLoad(t *testing.T, interrupt func(*node)) {
	const (
		writers = 8
		// Interrupt once this many writes were acknowledged (or the load
		// deadline passes), so the interruption lands mid-load.
		interruptAfter = 1000
	)
	n := startNode(t, nodeOptions{})
	ctx := testCtx(t, 3*time.Minute)
	cli := n.client(t)

	var (
		acked atomic.Int64
		mu    sync.Mutex
		acks  = make([][]ack, writers)
		wg    sync.WaitGroup
		// reached is closed when the interruptAfter-th write is
		// acknowledged.
		reached = make(chan struct{})
	)
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	for g := range writers {
		wg.Go(func() {
			for i := 0; loadCtx.Err() == nil; i++ {
				key := fmt.Sprintf("crash/%d/%06d", g, i)
				val := fmt.Sprintf("value-%d-%d", g, i)
				opCtx, cancel := context.WithTimeout(loadCtx, 10*time.Second)
				resp, err := cli.Txn(opCtx).
					If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
					Then(clientv3.OpPut(key, val)).
					Commit()
				cancel()
				if err != nil {
					return // the server is gone; this write was not acknowledged
				}
				if !resp.Succeeded {
					t.Errorf("create of fresh key %s found it present", key)
					return
				}
				mu.Lock()
				acks[g] = append(acks[g], ack{key: key, value: val, rev: resp.Header.Revision})
				mu.Unlock()
				if acked.Add(1) == interruptAfter {
					close(reached)
				}
			}
		})
	}

	select {
	case <-reached:
	case <-time.After(60 * time.Second):
		// The load deadline: a load that failed or crawls is interrupted
		// all the same, and what it did acknowledge is checked.
	}
	interrupt(n)
	// The server is gone: nothing can be acknowledged any more, and the
	// client would otherwise retry unsent writes until their deadline.
	stopLoad()
	wg.Wait()
	cli.Close()

	total := acked.Load()
	if total == 0 {
		t.Fatal("no write was acknowledged before the interruption")
	}
	t.Logf("%d writes acknowledged before the interruption", total)

	n.restart()
	cli = n.client(t)
	get, err := cli.Get(ctx, "crash/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	byKey := make(map[string]*mvccpb.KeyValue, len(get.Kvs))
	for _, kv := range get.Kvs {
		byKey[string(kv.Key)] = kv
	}

	// Problems are gathered per kind and reported with a few examples, so a
	// broken recovery yields a readable failure rather than thousands of lines.
	problems := map[string][]string{}
	report := func(kind, format string, args ...any) {
		problems[kind] = append(problems[kind], fmt.Sprintf(format, args...))
	}
	seenRev := make(map[int64]string)
	for g, list := range acks {
		for i, a := range list {
			if i > 0 && a.rev <= list[i-1].rev {
				report("revisions not increasing for one client's sequential writes", "writer %d: %d after %d", g, a.rev, list[i-1].rev)
			}
			if other, dup := seenRev[a.rev]; dup {
				report("revision acknowledged twice", "%d for %s and %s", a.rev, other, a.key)
			}
			seenRev[a.rev] = a.key
			kv, ok := byKey[a.key]
			if !ok {
				report("acknowledged creates lost", "%s@%d", a.key, a.rev)
				continue
			}
			if kv.ModRevision != a.rev || kv.CreateRevision != a.rev || kv.Version != 1 || string(kv.Value) != a.value {
				report("acknowledged creates changed", "%s@%d now %s", a.key, a.rev, kvString(kv))
			}
		}
	}
	for kind, list := range problems {
		t.Errorf("%s: %d of %d acknowledged writes, e.g. %q", kind, len(list), total, list[:min(len(list), 5)])
	}

	// Every surviving create (acknowledged or not) took one revision, and
	// nothing else was written: their revisions must be exactly 2, 3, ...
	revs := make([]int64, 0, len(get.Kvs))
	for _, kv := range get.Kvs {
		revs = append(revs, kv.ModRevision)
	}
	sort.Slice(revs, func(i, j int) bool { return revs[i] < revs[j] })
	for i, r := range revs {
		if want := int64(2 + i); r != want {
			t.Fatalf("revisions after restart are not dense: position %d holds revision %d, want %d (around it: %v)", i, r, want, revs[max(0, i-3):min(len(revs), i+3)])
		}
	}
	if want := int64(1 + len(revs)); get.Header.Revision != want {
		t.Errorf("revision after recovery %d, want %d (%d creates survived)", get.Header.Revision, want, len(revs))
	}
	put, err := cli.Put(ctx, "after-crash", "v")
	if err != nil {
		t.Fatal(err)
	}
	if put.Header.Revision != get.Header.Revision+1 {
		t.Errorf("first write after recovery at revision %d, want %d", put.Header.Revision, get.Header.Revision+1)
	}
}
