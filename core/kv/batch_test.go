package kv

import (
	"bytes"
	"testing"
)

func TestBatchCopiesAndBounds(t *testing.T) {
	if got := BatchWant(ScanOptions{}, 0); got != DefaultBatchPairs {
		t.Fatalf("default want %d", got)
	}
	if got := BatchWant(ScanOptions{BatchSize: 10, Limit: 25}, 20); got != 5 {
		t.Fatalf("want with 5 left of the limit: %d", got)
	}
	if got := BatchWant(ScanOptions{Limit: 3}, 3); got != 0 {
		t.Fatalf("want after the limit: %d", got)
	}
	b := NewBatch(3)
	src := []byte("key0value0")
	b.Add(src[:4], src[4:])
	src[0] = 'X' // the batch must hold a copy
	b.Add([]byte("k1"), nil)
	if b.Full() {
		t.Fatal("full after 2 of 3")
	}
	b.Add([]byte("k2"), []byte("v2"))
	if !b.Full() || b.Len() != 3 {
		t.Fatal("not full after 3 of 3")
	}
	p := b.Pairs()
	if string(p[0].Key) != "key0" || string(p[0].Value) != "value0" || len(p[1].Value) != 0 || string(p[2].Key) != "k2" {
		t.Fatalf("pairs %q", p)
	}
	// Appending to one pair's slice must not overwrite the next pair.
	_ = append(p[0].Key, 'Z')
	_ = append(p[0].Value, 'Z')
	if !bytes.Equal(p[1].Key, []byte("k1")) {
		t.Fatalf("append ran into the neighbour: %q", p[1].Key)
	}
	big := NewBatch(1000)
	for !big.Full() {
		big.Add([]byte("k"), make([]byte, 1<<20))
	}
	if big.Len() != MaxBatchBytes/(1<<20) {
		t.Fatalf("byte budget: %d pairs of 1 MiB", big.Len())
	}
}
