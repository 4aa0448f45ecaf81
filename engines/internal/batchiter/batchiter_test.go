package batchiter

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/engramkv/engram/core/kv"
)

// keys is a Source over n numbered keys that counts its releases.
type keys struct {
	n, next  int
	released int
	failNext error
}

func (k *keys) Fill(b *kv.Batch, _ int) (bool, error) {
	if err := k.failNext; err != nil {
		k.failNext = nil
		return false, err
	}
	for ; !b.Full(); k.next++ {
		if k.next == k.n {
			return true, nil
		}
		b.Add([]byte(fmt.Sprintf("k%03d", k.next)), nil)
	}
	return false, nil
}

func (k *keys) Release() { k.released++ }

// gate is a Gate that a test closes.
type gate struct{ closed bool }

func (g *gate) Enter() error {
	if g.closed {
		return kv.ErrClosed
	}
	return nil
}

func (g *gate) Exit() {}

func sizes(t *testing.T, it *Iterator) []int {
	t.Helper()
	var got []int
	for {
		pairs, err := it.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(pairs) == 0 {
			return got
		}
		got = append(got, len(pairs))
	}
}

// TestBatchesAndLimit: batches hold BatchSize pairs, the scan stops at
// Limit, and the source is released exactly once, when the scan ends.
func TestBatchesAndLimit(t *testing.T) {
	for _, tc := range []struct {
		n, batch, limit int
		want            string
	}{
		{n: 7, batch: 3, want: "[3 3 1]"},
		{n: 7, batch: 3, limit: 5, want: "[3 2]"},
		{n: 6, batch: 3, limit: 6, want: "[3 3]"},
		{n: 0, batch: 3, want: "[]"},
	} {
		src := &keys{n: tc.n}
		it := New(&gate{}, src, kv.ScanOptions{BatchSize: tc.batch, Limit: tc.limit})
		if got := fmt.Sprint(sizes(t, it)); got != tc.want {
			t.Errorf("%+v: batches %s, want %s", tc, got, tc.want)
		}
		if err := it.Close(); err != nil {
			t.Fatal(err)
		}
		if src.released != 1 {
			t.Errorf("%+v: released %d times, want once", tc, src.released)
		}
	}
}

// TestErrorLeavesScanOpen: a failed Fill is returned and the next Next
// asks the source again.
func TestErrorLeavesScanOpen(t *testing.T) {
	boom := errors.New("boom")
	src := &keys{n: 2, failNext: boom}
	it := New(&gate{}, src, kv.ScanOptions{})
	if _, err := it.Next(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Next = %v, want %v", err, boom)
	}
	if got := fmt.Sprint(sizes(t, it)); got != "[2]" {
		t.Fatalf("after the error: batches %s, want [2]", got)
	}
}

// TestGateAndContext: a closed store and a cancelled context are refused
// before the source is read.
func TestGateAndContext(t *testing.T) {
	g := &gate{}
	src := &keys{n: 2}
	it := New(g, src, kv.ScanOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := it.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next(cancelled) = %v", err)
	}
	g.closed = true
	if _, err := it.Next(context.Background()); !errors.Is(err, kv.ErrClosed) {
		t.Fatalf("Next on a closed store = %v", err)
	}
	if src.next != 0 {
		t.Fatalf("the source was read %d pairs", src.next)
	}
}

// TestCloseAll: the store's Close closes the iterators still open, once
// each, and an ended or empty scan is not kept.
func TestCloseAll(t *testing.T) {
	var open Open
	a, b := &keys{n: 5}, &keys{n: 1}
	itA := New(&gate{}, a, kv.ScanOptions{})
	itB := New(&gate{}, b, kv.ScanOptions{})
	open.Add(itA)
	open.Add(itB)
	open.Add(New(&gate{}, nil, kv.ScanOptions{}))
	sizes(t, itB) // ends, so unregisters
	if n := len(open.its); n != 1 {
		t.Fatalf("%d iterators registered, want 1", n)
	}
	open.CloseAll()
	open.CloseAll()
	if a.released != 1 || b.released != 1 {
		t.Fatalf("released %d and %d times, want once each", a.released, b.released)
	}
	if pairs, err := itA.Next(context.Background()); err != nil || len(pairs) != 0 {
		t.Fatalf("Next after close = %d pairs, %v", len(pairs), err)
	}
}
