package tikv

import (
	"context"
	"errors"
	"testing"

	"github.com/engramkv/engram/core/kv"
)

// TestReclaimIsANoOp: Defragment's reclamation does nothing on TiKV (it
// compacts by itself) and in particular leaves the cluster's GC safe point
// where it was; after Close it refuses as every call does.
func TestReclaimIsANoOp(t *testing.T) {
	ctx := context.Background()
	s := newMock(t, Options{})
	pd := s.kvs.GetPDClient()
	before, err := pd.UpdateGCSafePoint(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reclaim(ctx); err != nil {
		t.Fatalf("Reclaim: %v", err)
	}
	if after, err := pd.UpdateGCSafePoint(ctx, 0); err != nil || after != before {
		t.Fatalf("GC safe point %d -> %d (%v): Reclaim must not move it", before, after, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Reclaim(ctx); !errors.Is(err, kv.ErrClosed) {
		t.Fatalf("Reclaim after Close: %v, want kv.ErrClosed", err)
	}
}
