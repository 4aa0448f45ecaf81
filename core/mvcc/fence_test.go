package mvcc

import (
	"context"
	"errors"
	"testing"

	"github.com/engramkv/engram/core/coder"
	"github.com/engramkv/engram/core/election"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/plugins/memkv"
)

// TestDeposedLeaderCannotCompact: a leader that lost the election but
// still believes it leads (inside its lease) must not move the compacted
// revision or delete history the new leader serves: compaction's writes
// carry the fence like every other write.
func TestDeposedLeaderCannotCompact(t *testing.T) {
	ctx := context.Background()
	store := memkv.New()
	term1 := election.FenceOp(1)
	if err := store.Commit(ctx, []kv.Op{kv.Put(term1.Key, term1.Value)}); err != nil {
		t.Fatal(err)
	}
	old, err := Open(ctx, Options{Store: store, Fence: func() (kv.Op, error) { return election.FenceOp(1), nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = old.Close() })
	for _, v := range []string{"1", "2", "3", "4"} {
		put(t, old, "k", v)
	}
	history := countSpace(t, store, coder.SpaceObject)

	// A new leader takes over: the term record moves on.
	term2 := election.FenceOp(2)
	if err := store.Commit(ctx, []kv.Op{kv.Put(term2.Key, term2.Value)}); err != nil {
		t.Fatal(err)
	}

	if _, err := old.Compact(ctx, old.Rev(), false); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("compaction by a deposed leader: %v, want ErrNotLeader", err)
	}
	if _, err := store.Get(ctx, coder.MetaKey(metaCompact)); !errors.Is(err, kv.ErrNotFound) {
		t.Fatalf("the deposed leader changed the stored compacted revision (%v)", err)
	}
	if old.CompactRev() != 0 {
		t.Fatalf("the deposed leader believes it compacted at %d", old.CompactRev())
	}
	// Physical compaction, as the background loop would run it.
	if err := old.compactPhysical(ctx, 0, old.Rev()); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("physical compaction by a deposed leader: %v, want ErrNotLeader", err)
	}
	if n := countSpace(t, store, coder.SpaceObject); n != history {
		t.Fatalf("the deposed leader deleted history: %d versions left of %d", n, history)
	}
}
