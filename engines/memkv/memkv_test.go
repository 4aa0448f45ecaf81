package memkv

import (
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvtest"
)

func TestConformance(t *testing.T) {
	kvtest.Run(t, func(t *testing.T) kv.Store { return New() })
}

// TestSizeCountsWhatIsHeld: Size is the bytes of the keys and values held,
// through inserts, overwrites (larger and smaller), conditional writes,
// deletes of present and absent keys, and a conflict that applies nothing.
func TestSizeCountsWhatIsHeld(t *testing.T) {
	s := New()
	ctx := t.Context()
	step := func(want int64, ops ...kv.Op) {
		t.Helper()
		_ = s.Commit(ctx, ops)
		if got, err := s.Size(); err != nil || got != want {
			t.Fatalf("after %v: Size = %d, %v; want %d", ops, got, err, want)
		}
	}
	step(2+3+2+1, kv.Put([]byte("k1"), []byte("abc")), kv.Put([]byte("k2"), []byte("x")))
	step(2+10+2+1, kv.Put([]byte("k1"), []byte("0123456789")))
	step(2+0+2+1, kv.CompareAndSwap([]byte("k1"), []byte("0123456789"), nil))
	step(2+0+2+1, kv.PutIfAbsent([]byte("k2"), []byte("conflict: nothing applied")))
	step(2+0, kv.Delete([]byte("k2")), kv.Delete([]byte("absent")))
	step(0, kv.CompareAndDelete([]byte("k1"), nil))
	_ = s.Close()
	if _, err := s.Size(); err != kv.ErrClosed {
		t.Errorf("Size after Close: %v, want kv.ErrClosed", err)
	}
}
