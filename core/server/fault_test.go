package server_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvfault"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
)

// TestUncertainAndFailingCommitsKeepWatchCorrect injects uncertain commits
// (some applied, some not), plain commit errors, failed reads and delays
// under a write and watch load. Every acknowledged write must be stored at
// its revision, revisions must stay dense, and the watcher must see exactly
// the stored changes, in order, once each.
func TestUncertainAndFailingCommitsKeepWatchCorrect(t *testing.T) {
	t.Parallel()
	store := kvfault.Wrap(memkv.New())
	srv := servertest.Start(t, store, servertest.Options{})
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	wch := c.Watch(ctx, "/f/", clientv3.WithPrefix(), clientv3.WithRev(2))
	uncertain := fmt.Errorf("injected timeout: %w", kv.ErrUncertain)
	// One commit in two meets a fault: applied-but-uncertain,
	// not-applied-and-uncertain, a plain failure or a delay; one read in
	// four fails.
	pattern := []kvfault.Fault{
		{Err: uncertain, Apply: true}, {},
		{Err: uncertain}, {},
		{Err: errors.New("injected commit failure")}, {},
		{Delay: 5 * time.Millisecond}, {},
	}
	for range 100 {
		store.FailCommits(pattern...)
		store.FailGets(kvfault.Fault{Err: errors.New("injected read failure")}, kvfault.Fault{}, kvfault.Fault{}, kvfault.Fault{})
	}
	var (
		mu    sync.Mutex
		acked = map[string]int64{}
	)
	var writers sync.WaitGroup
	for w := range 6 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := range 60 {
				key := fmt.Sprintf("/f/%d/%d", w, i)
				r, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, "v")).Commit()
				if err == nil && r.Succeeded {
					mu.Lock()
					acked[key] = r.Header.Revision
					mu.Unlock()
				}
			}
		}()
	}
	writers.Wait()

	list, err := c.Get(ctx, "/f/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	stored := map[int64]string{}
	for _, kv := range list.Kvs {
		stored[kv.ModRevision] = string(kv.Key)
	}
	for k, rev := range acked {
		if stored[rev] != k {
			t.Errorf("acknowledged %s at %d; revision %d holds %q", k, rev, rev, stored[rev])
		}
	}
	head := list.Header.Revision
	if int64(len(list.Kvs)) != head-1 {
		t.Fatalf("%d keys stored but head revision %d: revisions not dense", len(list.Kvs), head)
	}
	if len(acked) == 0 || len(acked) > 300 {
		t.Fatalf("%d of 360 writes acknowledged: the faults did not bite", len(acked))
	}
	for want := int64(2); want <= head; {
		select {
		case wr := <-wch:
			if err := wr.Err(); err != nil {
				t.Fatal(err)
			}
			for _, ev := range wr.Events {
				if ev.Kv.ModRevision != want || stored[want] != string(ev.Kv.Key) {
					t.Fatalf("watch event %q at %d, want %q at %d", ev.Kv.Key, ev.Kv.ModRevision, stored[want], want)
				}
				want++
			}
		case <-ctx.Done():
			t.Fatalf("watch stopped at revision %d of %d", want, head)
		}
	}
	t.Logf("%d acknowledged, %d stored, head %d", len(acked), len(list.Kvs), head)
}
