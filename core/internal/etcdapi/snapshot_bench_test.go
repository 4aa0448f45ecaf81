package etcdapi

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// snapshotSink is a Snapshot stream that counts what it is sent; gRPC's
// own marshalling is left out, so what is measured is the sender's.
type snapshotSink struct {
	grpc.ServerStream
	ctx  context.Context
	sent int64
}

func (s *snapshotSink) Context() context.Context { return s.ctx }
func (s *snapshotSink) Send(r *pb.SnapshotResponse) error {
	s.sent += int64(len(r.Blob))
	return nil
}

// BenchmarkSnapshotSend streams a snapshot of 20,000 objects of 512 bytes
// (about 12 MB) from the Maintenance handler: the file built by
// backup.Save, then sent in chunks. It reports the bytes the sender
// allocates per byte sent, alloc-B/sent-B (copying each chunk once cost
// a byte of garbage per byte sent).
func BenchmarkSnapshotSend(b *testing.B) {
	k, be := newBenchServer(b)
	ctx := context.Background()
	value := make([]byte, 512)
	for i := range 20000 {
		if _, err := be.Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "/registry/pods/default/pod-%08d", i), Value: value}); err != nil {
			b.Fatal(err)
		}
	}
	m := &maintenanceServer{s: k.s}
	var before, after runtime.MemStats
	var sent int64
	b.ReportAllocs()
	runtime.ReadMemStats(&before)
	for b.Loop() {
		sink := &snapshotSink{ctx: ctx}
		if err := m.Snapshot(&pb.SnapshotRequest{}, sink); err != nil {
			b.Fatal(err)
		}
		sent += sink.sent
	}
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(sent), "alloc-B/sent-B")
}
