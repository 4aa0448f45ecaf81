package badger

import (
	"context"
	"errors"
	"testing"

	"github.com/engramkv/engram/engines/internal/enginetest"
)

// TestReclaimHonoursContext: a Reclaim whose context is already done does
// no work and says why, as kv.Reclaimer requires; one with a live context
// runs a reclamation.
func TestReclaimHonoursContext(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir(), GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	enginetest.WriteRevisions(t, s, 0, 100)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Reclaim(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reclaim with a canceled context: %v, want context.Canceled", err)
	}
	if n := s.reclaim.runs.Load(); n != 0 {
		t.Fatalf("a canceled Reclaim ran %d reclamation(s)", n)
	}
	if err := s.Reclaim(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := s.reclaim.runs.Load(); n != 1 {
		t.Fatalf("Reclaim ran %d reclamation(s), want 1", n)
	}
}

// TestReclaimInMemory: an in-memory store has no value log; Reclaim still
// compacts its tables and succeeds.
func TestReclaimInMemory(t *testing.T) {
	s, err := Open(Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	enginetest.WriteRevisions(t, s, 0, 100)
	if err := s.Reclaim(context.Background()); err != nil {
		t.Fatalf("Reclaim on an in-memory store: %v", err)
	}
	if _, err := s.Get(context.Background(), enginetest.RevKey(7)); err != nil {
		t.Fatalf("key after Reclaim: %v", err)
	}
}
