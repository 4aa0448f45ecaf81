package mvcc

import (
	"context"
	"fmt"
	"sync"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/memkv"
)

// scanRecorder records the options of every scan of one space.
type scanRecorder struct {
	kv.Store
	space byte
	mu    sync.Mutex
	scans []kv.ScanOptions
}

func (s *scanRecorder) take() []kv.ScanOptions {
	s.mu.Lock()
	defer s.mu.Unlock()
	scans := s.scans
	s.scans = nil
	return scans
}

func (s *scanRecorder) Scan(ctx context.Context, opts kv.ScanOptions) (kv.Iterator, error) {
	if len(opts.Start) >= 4 && opts.Start[3] == s.space {
		s.mu.Lock()
		s.scans = append(s.scans, opts)
		s.mu.Unlock()
	}
	return s.Store.Scan(ctx, opts)
}

// TestCountOnlyReadsHeadersOnly: a count_only Range (kube-apiserver counts
// every resource this way; RangeStream counts what a limit left this way)
// only counts: every scan of the revision keys asks for the version
// headers alone, whatever the limit, so no value of the range is read or
// held. The counts are the range's live keys at the revision asked.
func TestCountOnlyReadsHeadersOnly(t *testing.T) {
	ctx := context.Background()
	rec := &scanRecorder{Store: memkv.New(), space: 'k'}
	b := open(t, rec)
	for i := range 50 {
		put(t, b, fmt.Sprintf("/c/%02d", i), "value")
	}
	at := b.Rev()
	if _, err := b.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("/c/4"), RangeEnd: []byte("/c/5")}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		req  *pb.RangeRequest
		want int64
	}{
		{&pb.RangeRequest{Key: []byte("/c/"), RangeEnd: []byte("/c0"), CountOnly: true}, 40},
		{&pb.RangeRequest{Key: []byte("/c/"), RangeEnd: []byte("/c0"), CountOnly: true, Limit: 5}, 40},
		{&pb.RangeRequest{Key: []byte("/c/"), RangeEnd: []byte("/c0"), CountOnly: true, Revision: at}, 50},
	} {
		rec.take()
		r, err := b.Range(ctx, c.req)
		if err != nil || r.Count != c.want || len(r.Kvs) != 0 {
			t.Fatalf("%v: count %d, %d kvs, %v; want count %d", c.req, r.GetCount(), len(r.GetKvs()), err, c.want)
		}
		scans := rec.take()
		if len(scans) == 0 {
			t.Fatalf("%v: no scan of the revision keys recorded", c.req)
		}
		for _, o := range scans {
			if o.ValuePrefix == 0 {
				t.Fatalf("%v: a scan read whole values: %+v", c.req, o)
			}
		}
	}
}
