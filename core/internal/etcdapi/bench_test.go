package etcdapi

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/internal/auth"
	"github.com/engramkv/engram/core/internal/lease"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/watch"
	"github.com/engramkv/engram/engines/memkv"
)

// BenchmarkKV calls the KV handlers directly, without gRPC, on a leader
// over memkv with auth off, as a server without a cluster runs them
// ("api"), and the same requests straight into the MVCC backend
// ("backend"): the difference of the two is what this package adds per
// request (validation, quota admission, authorization, headers). Request
// shapes are kube-apiserver's, as in core/server's BenchmarkRequests.
func BenchmarkKV(b *testing.B) {
	const preload = 1024
	value := make([]byte, 512)
	for _, w := range []string{"put", "create", "update", "get"} {
		for _, layer := range []string{"api", "backend"} {
			b.Run(w+"/"+layer, func(b *testing.B) {
				k, be := newBenchServer(b)
				ctx := context.Background()
				keys := make([][]byte, preload)
				revs := make([]int64, preload)
				for i := range keys {
					keys[i] = fmt.Appendf(nil, "/registry/pods/default/pod-with-a-kubernetes-like-name-%08d", i)
					resp, err := be.Put(ctx, &pb.PutRequest{Key: keys[i], Value: value})
					if err != nil {
						b.Fatal(err)
					}
					revs[i] = resp.Header.Revision
				}
				put := k.Put
				txn := k.Txn
				rng := k.Range
				if layer == "backend" {
					put, txn, rng = be.Put, be.Txn, be.Range
				}
				fresh := make([][]byte, 0, 1<<16)
				newKey := func(i int) []byte {
					if i < len(fresh) {
						return fresh[i]
					}
					return fmt.Appendf(nil, "/registry/events/default/event-with-a-kubernetes-like-name-%012d", i)
				}
				for i := range cap(fresh) {
					fresh = append(fresh, newKey(i))
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					var err error
					switch w {
					case "put":
						_, err = put(ctx, &pb.PutRequest{Key: newKey(i), Value: value})
					case "create":
						key := newKey(i)
						var resp *pb.TxnResponse
						resp, err = txn(ctx, &pb.TxnRequest{
							Compare: []*pb.Compare{{Key: key, Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{}}},
							Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: key, Value: value}}}},
						})
						if err == nil && !resp.Succeeded {
							b.Fatal("create failed its compare")
						}
					case "update":
						n := i % preload
						var resp *pb.TxnResponse
						resp, err = txn(ctx, &pb.TxnRequest{
							Compare: []*pb.Compare{{Key: keys[n], Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: revs[n]}}},
							Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: keys[n], Value: value}}}},
							Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: keys[n]}}}},
						})
						if err == nil {
							if !resp.Succeeded {
								b.Fatal("update failed its compare")
							}
							revs[n] = resp.Header.Revision
						}
					case "get":
						_, err = rng(ctx, &pb.RangeRequest{Key: keys[i%preload], Limit: 1})
					}
					if err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		}
	}
}

// newBenchServer is a leader's KV service over memkv as core/server
// assembles it, with the auth state present and off.
func newBenchServer(b *testing.B) (*kvServer, *mvcc.Backend) {
	b.Helper()
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	st := memkv.New()
	b.Cleanup(func() { _ = st.Close() })
	lessor := lease.New(lease.Options{})
	be, err := mvcc.Open(ctx, mvcc.Options{Store: st, Lessor: lessor, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	hub := watch.NewHub(be, watch.Options{Logger: log})
	be.SetNotifier(hub)
	b.Cleanup(func() {
		hub.Close()
		_ = be.Close()
	})
	tokens, err := auth.NewTokens("simple", 0)
	if err != nil {
		b.Fatal(err)
	}
	as, err := auth.Open(ctx, auth.Options{Store: st, Tokens: tokens, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	s := New(Options{Role: &Role{Backend: be, Hub: hub, Lessor: lessor, LeaderID: MemberID("bench")}, Store: st, Logger: log, Name: "bench", Auth: as})
	return &kvServer{s: s}, be
}
