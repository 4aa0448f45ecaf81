package host

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/proctest"
)

// Shapes of kube-apiserver's requests, as in engram bench (bench/README.md,
// "kube-apiserver's requests"): keys
// of about 70 bytes, 512-byte values, many concurrent clients.
const (
	serverBenchClients = 64
	serverBenchPreload = 2000
	serverBenchPage    = 500
)

func serverBenchKey(i int) string {
	return fmt.Sprintf("/registry/pods/namespace-default/pod-with-a-kubernetes-like-name-%08d", i)
}

// serverBenchNewKey is a created key: outside the listed prefix, so the list
// workload reads the same keys on both stores however many creates ran.
func serverBenchNewKey(i int) string {
	return fmt.Sprintf("/registry/events/namespace-default/event-with-a-kubernetes-like-name-%08d", i)
}

// benchServerStores starts the whole server (gRPC, mvcc, watch) on native
// memkv and on memkv.wasm through this host, each with the same preloaded
// keys, and returns a client of each.
func benchServerStores(b *testing.B) map[string]*clientv3.Client {
	p := loadPlugin(b, "memkv", Options{})
	w, err := p.Open(context.Background(), StoreOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = w.Close() })
	native := memkv.New()
	b.Cleanup(func() { _ = native.Close() })
	out := map[string]*clientv3.Client{}
	value := make([]byte, 512)
	for name, st := range map[string]kv.Store{"native": native, "wasm": w} {
		srv := servertest.Start(b, st, servertest.Options{})
		c := srv.Client(b)
		for i := range serverBenchPreload {
			if _, err := c.Put(context.Background(), serverBenchKey(i), string(value)); err != nil {
				b.Fatal(err)
			}
		}
		out[name] = c
	}
	return out
}

// BenchmarkServer runs kube-apiserver-shaped requests through clientv3
// against the whole server on native memkv and on memkv.wasm: the wasm
// store is required to stay within 20% of the native one on every
// workload. ns/op is wall time per request with serverBenchClients in
// flight, so it is the inverse of throughput; cpu-ns/op is the CPU the
// whole process (client and server) spent per request, the steadier
// figure on a shared machine.
func BenchmarkServer(b *testing.B) {
	clients := benchServerStores(b)
	value := string(make([]byte, 512))
	var next atomic.Int64
	workloads := []struct {
		name string
		op   func(ctx context.Context, c *clientv3.Client, i int) error
	}{
		{"create", func(ctx context.Context, c *clientv3.Client, _ int) error {
			key := serverBenchNewKey(int(next.Add(1)))
			resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, value)).Commit()
			if err == nil && !resp.Succeeded {
				err = fmt.Errorf("create of %s failed its compare", key)
			}
			return err
		}},
		{"get", func(ctx context.Context, c *clientv3.Client, i int) error {
			resp, err := c.Get(ctx, serverBenchKey(i%serverBenchPreload))
			if err == nil && len(resp.Kvs) != 1 {
				err = fmt.Errorf("get: %d kvs", len(resp.Kvs))
			}
			return err
		}},
		{"update", func(ctx context.Context, c *clientv3.Client, i int) error {
			key := serverBenchKey(i % serverBenchPreload)
			cur, err := c.Get(ctx, key)
			if err != nil {
				return err
			}
			// A lost race with another client is a failed compare, as
			// for kube-apiserver's GuaranteedUpdate: not an error here.
			_, err = c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", cur.Kvs[0].ModRevision)).
				Then(clientv3.OpPut(key, value)).Else(clientv3.OpGet(key)).Commit()
			return err
		}},
		{"list", func(ctx context.Context, c *clientv3.Client, _ int) error {
			// The reflector's paginated list: pages pinned to the first
			// page's revision.
			prefix := "/registry/pods/"
			key, rev, n := prefix, int64(0), 0
			for {
				opts := []clientv3.OpOption{clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)), clientv3.WithLimit(serverBenchPage)}
				if rev != 0 {
					opts = append(opts, clientv3.WithRev(rev))
				}
				resp, err := c.Get(ctx, key, opts...)
				if err != nil {
					return err
				}
				rev = resp.Header.Revision
				n += len(resp.Kvs)
				if !resp.More {
					break
				}
				key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
			}
			if n != serverBenchPreload {
				return fmt.Errorf("list: %d keys", n)
			}
			return nil
		}},
	}
	for _, w := range workloads {
		for _, name := range []string{"native", "wasm"} {
			c := clients[name]
			b.Run(w.name+"/"+name, func(b *testing.B) {
				var seq atomic.Int64
				b.SetParallelism((serverBenchClients + 1) / 2)
				b.ReportAllocs()
				defer proctest.ReportCPU(b)()
				b.RunParallel(func(pb *testing.PB) {
					ctx := context.Background()
					for pb.Next() {
						if err := w.op(ctx, c, int(seq.Add(1))); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
