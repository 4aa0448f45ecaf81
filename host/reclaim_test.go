package host

import (
	"context"
	"errors"
	"testing"

	"github.com/engramkv/engram/core/kv"
)

// TestReclaimIsANoOp: with no reclamation call in the ABI, a wasm engine's
// Reclaim succeeds without calling the guest, and refuses after Close as
// every call does.
func TestReclaimIsANoOp(t *testing.T) {
	p := loadPlugin(t, "memkv", Options{})
	s, err := p.Open(context.Background(), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reclaim(context.Background()); err != nil {
		t.Fatalf("Reclaim: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Reclaim(context.Background()); !errors.Is(err, kv.ErrClosed) {
		t.Fatalf("Reclaim after Close: %v, want kv.ErrClosed", err)
	}
}
