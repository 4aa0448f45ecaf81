package etcdapi

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"

	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/engines/memkv"
)

// The server-level differential tests cannot decide when the server reads
// its next chunk (it runs ahead of the client as far as gRPC's flow control
// lets it). These drive the stream directly, so a change between two
// chunks lands exactly between their reads.

// hookStream is a RangeStream server stream that records the chunks and
// runs after (if set) once each chunk is sent, before the next is read.
type hookStream struct {
	grpc.ServerStream
	ctx    context.Context
	chunks []*pb.RangeResponse
	after  func(chunk int)
}

func (s *hookStream) Context() context.Context { return s.ctx }

func (s *hookStream) Send(m *pb.RangeStreamResponse) error {
	s.chunks = append(s.chunks, m.RangeResponse)
	if s.after != nil {
		s.after(len(s.chunks) - 1)
	}
	return nil
}

func newStreamServer(t *testing.T, keys int) (*kvServer, *mvcc.Backend, context.Context) {
	t.Helper()
	ctx := t.Context()
	st := memkv.New()
	t.Cleanup(func() { _ = st.Close() })
	b, err := mvcc.Open(ctx, mvcc.Options{Store: st, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	for k := range keys {
		if _, err := b.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "k/%04d", k), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	return &kvServer{s: New(Options{Role: &Role{Backend: b}, Store: st})}, b, ctx
}

// TestRangeStreamKeepsFirstRevision: every chunk after the first reads at
// the revision the first one pinned, though keys are changed, deleted and
// created in the range between every two chunks.
func TestRangeStreamKeepsFirstRevision(t *testing.T) {
	k, b, ctx := newStreamServer(t, 200)
	s := &hookStream{ctx: ctx}
	s.after = func(chunk int) {
		n := 10 + 20*chunk
		for _, req := range []*pb.PutRequest{
			{Key: fmt.Appendf(nil, "k/%04d", n), Value: []byte("changed")},
			{Key: fmt.Appendf(nil, "k/%04d/new", n), Value: []byte("new")},
		} {
			if _, err := b.Put(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: fmt.Appendf(nil, "k/%04d", n+1)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.RangeStream(&pb.RangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0")}, s); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range s.chunks {
		for _, kv := range c.Kvs {
			got = append(got, fmt.Sprintf("%s=%s@%d", kv.Key, kv.Value, kv.ModRevision))
		}
	}
	last := s.chunks[len(s.chunks)-1]
	if len(s.chunks) < 3 || len(got) != 200 || last.Count != 200 || last.Header.Revision != 201 {
		t.Fatalf("%d chunks, %d keys, count %d, header %v; want 200 keys at revision 201 in several chunks", len(s.chunks), len(got), last.Count, last.Header)
	}
	for i, g := range got {
		if want := fmt.Sprintf("k/%04d=v@%d", i, i+2); g != want {
			t.Fatalf("key-value %d: %s, want %s", i, g, want)
		}
	}
}

// TestRangeStreamCompactedBetweenChunks: a compaction past the stream's
// revision between two chunks ends the stream with etcd's compaction error
// after the chunks already sent, as etcd's next chunk read fails.
func TestRangeStreamCompactedBetweenChunks(t *testing.T) {
	k, b, ctx := newStreamServer(t, 100)
	s := &hookStream{ctx: ctx}
	s.after = func(chunk int) {
		if chunk != 0 {
			return
		}
		if _, err := b.Put(ctx, &pb.PutRequest{Key: []byte("other"), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Compact(ctx, b.Rev(), true); err != nil {
			t.Fatal(err)
		}
	}
	err := k.RangeStream(&pb.RangeRequest{Key: []byte("k/"), RangeEnd: []byte("k0")}, s)
	if err != rpctypes.ErrGRPCCompacted || len(s.chunks) != 1 {
		t.Fatalf("stream compacted after its first chunk: %d chunks, error %v; want 1 chunk and %v", len(s.chunks), err, rpctypes.ErrGRPCCompacted)
	}
}

// TestNextChunkLimit: etcd's sizing of the next chunk.
func TestNextChunkLimit(t *testing.T) {
	const target = 1000
	for _, c := range []struct {
		last int64
		size int
		want int64
		what string
	}{
		{10, 499, 20, "under half: double"},
		{10, 500, 10, "half: keep"},
		{10, 2000, 10, "twice: keep"},
		{10, 2001, 5, "over twice: halve"},
		{1, 5000, 1, "never below one"},
	} {
		if got := nextChunkLimit(c.last, c.size, target); got != c.want {
			t.Errorf("%s: nextChunkLimit(%d, %d, %d) = %d, want %d", c.what, c.last, c.size, target, got, c.want)
		}
	}
}
