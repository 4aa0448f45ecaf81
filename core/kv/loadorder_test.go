package kv_test

import (
	"testing"

	"github.com/engramkv/engram/core/kv"
)

// TestLoadOrder checks the order rules of a Load's streams: ascending
// within each, any interleaving across them, disjoint ranges at the end.
func TestLoadOrder(t *testing.T) {
	var o kv.LoadOrder
	for _, step := range []struct {
		stream int
		key    string
	}{{2, "k/1"}, {0, "a/1"}, {2, "k/2"}, {0, "a/2"}, {1, "e/1"}} {
		if err := o.Check(step.stream, []byte(step.key)); err != nil {
			t.Fatalf("Check(%d, %q): %v", step.stream, step.key, err)
		}
	}
	if err := o.Check(2, []byte("k/2")); err == nil {
		t.Fatal("Check accepted a repeated key")
	}
	if err := o.Check(0, []byte("a/0")); err == nil {
		t.Fatal("Check accepted a key sorting before its stream's last")
	}
	for _, bad := range []int{-1, kv.MaxLoadStreams} {
		if err := o.Check(bad, []byte("z")); err == nil {
			t.Fatalf("Check accepted stream %d", bad)
		}
	}
	if err := o.Disjoint(); err != nil {
		t.Fatalf("Disjoint: %v", err)
	}
	// Stream 3 starts inside stream 0's range.
	if err := o.Check(3, []byte("a/15")); err != nil {
		t.Fatal(err)
	}
	if err := o.Disjoint(); err == nil {
		t.Fatal("Disjoint accepted overlapping streams")
	}
}
