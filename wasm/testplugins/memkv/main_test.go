package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/engramkv/engram/wasm/sdk"
)

// newStore returns a store initialised as the host would.
func newStore(t *testing.T) *store {
	t.Helper()
	s := &store{}
	if _, err := s.Init(context.Background(), nil, sdk.HostInfo{}); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestScanSnapshot: a scan keeps seeing the data of when it opened while
// commits change and delete what it has not read yet.
func TestScanSnapshot(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	var ops []sdk.Op
	for i := range 2000 {
		ops = append(ops, sdk.Op{Kind: sdk.OpPut, Key: fmt.Appendf(nil, "k%05d", i), Value: []byte("old")})
	}
	if err := s.Commit(ctx, ops); err != nil {
		t.Fatal(err)
	}
	it, err := s.Scan(ctx, sdk.ScanOptions{Start: []byte("k"), End: []byte("l")})
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for {
		batch, err := it.Next(ctx, 97)
		if err != nil {
			t.Fatal(err)
		}
		if len(batch) == 0 {
			break
		}
		for _, p := range batch {
			if want := fmt.Sprintf("k%05d", seen); string(p.Key) != want || string(p.Value) != "old" {
				t.Fatalf("pair %d: %s=%s, want %s=old", seen, p.Key, p.Value, want)
			}
			seen++
		}
		// Overwrite, delete and insert around what the scan reads next.
		ops := []sdk.Op{
			{Kind: sdk.OpPut, Key: fmt.Appendf(nil, "k%05d", seen+1), Value: []byte("new")},
			{Kind: sdk.OpDelete, Key: fmt.Appendf(nil, "k%05d", seen+3)},
			{Kind: sdk.OpPut, Key: fmt.Appendf(nil, "k%05d-new", seen+5), Value: []byte("new")},
		}
		if err := s.Commit(ctx, ops); err != nil {
			t.Fatal(err)
		}
	}
	if seen != 2000 {
		t.Fatalf("scan saw %d pairs, want 2000", seen)
	}
}

// TestScanRanges scans random ranges in both directions with random batch
// sizes and checks the pairs against a sorted model: bounds that fall
// inside a leaf, on a separator, before and after every key.
func TestScanRanges(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 9))
	s := newStore(t)
	var keys []string
	var ops []sdk.Op
	for i := range 3000 {
		k := fmt.Sprintf("/registry/pods/ns/p%05d", i*2)
		keys = append(keys, k)
		ops = append(ops, sdk.Op{Kind: sdk.OpPut, Key: []byte(k), Value: []byte(k)})
	}
	if err := s.Commit(ctx, ops); err != nil {
		t.Fatal(err)
	}
	bound := func() []byte {
		switch rng.IntN(8) {
		case 0:
			return nil
		case 1:
			return []byte("/registry/pods/ns/p")
		case 2:
			return []byte("/registry/pods/ns/q")
		}
		return fmt.Appendf(nil, "/registry/pods/ns/p%05d", rng.IntN(6002))
	}
	for range 300 {
		start, end := bound(), bound()
		reverse := rng.IntN(2) == 0
		var want []string
		for _, k := range keys {
			if k >= string(start) && (len(end) == 0 || k < string(end)) {
				want = append(want, k)
			}
		}
		if reverse {
			slices.Reverse(want)
		}
		it, err := s.Scan(ctx, sdk.ScanOptions{Start: start, End: end, Reverse: reverse})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			batch, err := it.Next(ctx, 1+rng.IntN(100))
			if err != nil {
				t.Fatal(err)
			}
			if len(batch) == 0 {
				break
			}
			for _, p := range batch {
				got = append(got, string(p.Key))
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("scan [%q, %q) reverse=%v: %d keys, want %d", start, end, reverse, len(got), len(want))
		}
	}
}
