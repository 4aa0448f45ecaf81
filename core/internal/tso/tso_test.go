package tso

import (
	"context"
	"testing"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/memkv"
)

func TestRecover(t *testing.T) {
	ctx := context.Background()
	s := memkv.New()
	if rev, err := Recover(ctx, s); err != nil || rev != FirstRevision {
		t.Fatalf("empty store: %d %v", rev, err)
	}
	if err := s.Commit(ctx, []kv.Op{kv.Put(coder.EventKey(2), []byte{1}), kv.Put(coder.EventKey(300), []byte{1}), kv.Put(coder.MetaKey("zzz"), nil), kv.Put(coder.ObjectKey([]byte("k"), 900), nil)}); err != nil {
		t.Fatal(err)
	}
	if rev, err := Recover(ctx, s); err != nil || rev != 300 {
		t.Fatalf("recovered %d %v, want the last change-log revision 300", rev, err)
	}
}

func TestClockNeverGoesBack(t *testing.T) {
	c := New(5)
	c.Advance(5)
	c.Advance(7)
	defer func() {
		if recover() == nil {
			t.Fatal("moving the clock backwards did not panic")
		}
	}()
	c.Advance(6)
}
