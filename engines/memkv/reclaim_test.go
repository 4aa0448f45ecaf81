package memkv

import (
	"context"
	"errors"
	"testing"

	"github.com/engramkv/engram/core/kv"
)

// TestReclaim: nothing to reclaim, so nil while open, kv.ErrClosed after
// Close, and the context's error when it is already done.
func TestReclaim(t *testing.T) {
	s := New()
	if err := s.Reclaim(context.Background()); err != nil {
		t.Fatalf("Reclaim: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Reclaim(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reclaim with a canceled context: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Reclaim(context.Background()); !errors.Is(err, kv.ErrClosed) {
		t.Fatalf("Reclaim after Close: %v, want kv.ErrClosed", err)
	}
}
