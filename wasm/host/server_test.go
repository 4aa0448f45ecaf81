package host

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/server/servertest"
)

// TestServerOnMemKVWasm runs the whole server on memkv.wasm and drives it
// through clientv3 (servertest.Smoke).
func TestServerOnMemKVWasm(t *testing.T) {
	p := loadPlugin(t, "memkv", Options{})
	st, err := p.Open(context.Background(), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	servertest.Smoke(t, servertest.Start(t, st, servertest.Options{}))
}

// TestServerOnFaultyPlugin: misbehaving reads give the client a clean gRPC
// error, an UNCERTAIN commit is resolved by the server, and the server keeps
// serving with its data intact.
func TestServerOnFaultyPlugin(t *testing.T) {
	e := newFaulty(t, Options{}, 2)
	srv := servertest.Start(t, e.store, servertest.Options{})
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 10 {
		if _, err := c.Put(ctx, fmt.Sprintf("k%d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range []string{"panic", "trap", "garbage", "wronglen", "sleep"} {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Get(rctx, "faulty:"+w)
		rcancel()
		if err == nil {
			t.Errorf("%s: Get succeeded", w)
		} else {
			t.Logf("%s: client got %v", w, err)
		}
	}
	if _, err := c.Put(ctx, "w/faulty:uncertain", "applied"); err != nil {
		t.Errorf("an applied commit answered UNCERTAIN must resolve to success: %v", err)
	}
	resp, err := c.Get(ctx, "k", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 10 {
		t.Fatalf("after misbehaviours: %v, %d keys", err, len(resp.Kvs))
	}
	got, err := c.Get(ctx, "w/faulty:uncertain")
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("uncertain write: %v %v", err, got)
	}
	if _, err := c.Put(ctx, "after", "ok"); err != nil {
		t.Fatal(err)
	}
	if e.store.Stats().Failures == 0 {
		t.Error("no instance was discarded")
	}
}
