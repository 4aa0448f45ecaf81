package server_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/server/servertest"
)

func TestSmoke(t *testing.T) {
	srv := servertest.Start(t, servertest.Options{ProgressNotifyInterval: time.Second})
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if r.Header.Revision != 1 {
		t.Fatalf("fresh revision %d", r.Header.Revision)
	}
	p, err := c.Put(ctx, "a", "1")
	if err != nil {
		t.Fatal(err)
	}
	if p.Header.Revision != 2 {
		t.Fatalf("put rev %d", p.Header.Revision)
	}
	wch := c.Watch(ctx, "a", clientv3.WithRev(1), clientv3.WithPrevKV())
	if _, err := c.Put(ctx, "a", "2"); err != nil {
		t.Fatal(err)
	}
	g, err := c.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	kv := g.Kvs[0]
	if string(kv.Value) != "2" || kv.CreateRevision != 2 || kv.ModRevision != 3 || kv.Version != 2 {
		t.Fatalf("kv %+v", kv)
	}
	var got []string
	for len(got) < 2 {
		wr := <-wch
		if err := wr.Err(); err != nil {
			t.Fatal(err)
		}
		for _, ev := range wr.Events {
			got = append(got, string(ev.Kv.Value))
			if ev.Kv.ModRevision == 3 && (ev.PrevKv == nil || string(ev.PrevKv.Value) != "1") {
				t.Fatalf("prev kv %+v", ev.PrevKv)
			}
		}
	}
	t.Log(got)
}
