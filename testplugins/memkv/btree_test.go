package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/engramkv/engram/sdk"
)

// checkTree verifies the B-tree invariants: keys strictly ascending in an
// in-order walk, node sizes within bounds, all leaves at one depth.
func checkTree(t *testing.T, root *node) int {
	t.Helper()
	var prev []byte
	count := 0
	leafDepth := -1
	var walk func(n *node, depth int, isRoot bool)
	walk = func(n *node, depth int, isRoot bool) {
		if len(n.items) > maxItems || (!isRoot && len(n.items) < minItems) || len(n.items) == 0 {
			t.Fatalf("node at depth %d has %d items", depth, len(n.items))
		}
		if n.children != nil && len(n.children) != len(n.items)+1 {
			t.Fatalf("node with %d items has %d children", len(n.items), len(n.children))
		}
		for i, it := range n.items {
			if n.children != nil {
				walk(n.children[i], depth+1, false)
			}
			if prev != nil && bytes.Compare(prev, it.key) >= 0 {
				t.Fatalf("keys out of order: %q then %q", prev, it.key)
			}
			prev = it.key
			count++
		}
		if n.children != nil {
			walk(n.children[len(n.items)], depth+1, false)
		} else if leafDepth == -1 {
			leafDepth = depth
		} else if leafDepth != depth {
			t.Fatalf("leaves at depths %d and %d", leafDepth, depth)
		}
	}
	if root != nil {
		walk(root, 0, true)
	}
	return count
}

func dump(root *node, reverse bool, from []byte) []string {
	c := cursor{reverse: reverse}
	if reverse {
		c.seekLT(root, from)
	} else {
		c.seekGE(root, from)
	}
	var out []string
	for it, ok := c.next(); ok; it, ok = c.next() {
		out = append(out, string(it.key)+"="+string(it.value))
	}
	return out
}

func modelDump(m map[string]string, reverse bool, from []byte) []string {
	var out []string
	for k, v := range m {
		if len(from) > 0 && ((!reverse && k < string(from)) || (reverse && k >= string(from))) {
			continue
		}
		out = append(out, k+"="+v)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i][:bytes.IndexByte([]byte(out[i]), '=')], out[j][:bytes.IndexByte([]byte(out[j]), '=')]
		if reverse {
			return a > b
		}
		return a < b
	})
	return out
}

// TestTreeAgainstModel applies random changes and checks every snapshot
// against a map, including snapshots taken long ago: a change that mutated
// a frozen node would corrupt an old snapshot. Snapshots are taken at
// random points, so changes run both in place and by path copying.
func TestTreeAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 1))
	m := map[string]string{}
	var tr tree
	// Keys with long shared prefixes, prefixes of one another, and none:
	// the searches skip the bytes they know are shared.
	prefixes := []string{"", "/registry/pods/namespace-default/pod-with-a-long-name-", "/registry/pods/namespace-default/pod-with-a-long-name-0", "/registry/pods/namespace-default/", "/registry/pods/namespace-defaul"}
	type version struct {
		root *node
		m    map[string]string
	}
	var versions []version
	for round := range 400 {
		// Bias toward inserts early and deletes late, so the tree grows
		// several levels and then shrinks through every rebalancing path.
		ops := 1 + rng.IntN(60)
		for range ops {
			k := fmt.Sprintf("%s%04d", prefixes[rng.IntN(len(prefixes))], rng.IntN(3000))
			if rng.IntN(400) < round {
				tr.remove([]byte(k))
				delete(m, k)
			} else {
				v := fmt.Sprint(round)
				tr.set(item{key: []byte(k), value: []byte(v)})
				m[k] = v
			}
		}
		if n := checkTree(t, tr.root); n != len(m) {
			t.Fatalf("round %d: tree holds %d keys, model %d", round, n, len(m))
		}
		switch rng.IntN(10) {
		case 0:
			// A version kept to the end: frozen at once, or left to the
			// next change to freeze (a reader that stays open).
			cp := make(map[string]string, len(m))
			for k, v := range m {
				cp[k] = v
			}
			root := tr.snapshot()
			if rng.IntN(2) == 0 {
				root, _ = tr.read()
			}
			versions = append(versions, version{root, cp})
		case 1, 2:
			// A reader released before the next change: it freezes
			// nothing, and the changes that follow mutate in place.
			root, gen := tr.read()
			if got, want := dump(root, false, nil), modelDump(m, false, nil); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("round %d: a reader sees %d items, want %d", round, len(got), len(want))
			}
			tr.release(gen)
		}
	}
	versions = append(versions, version{tr.snapshot(), m})
	for i, v := range versions {
		for _, rev := range []bool{false, true} {
			for _, from := range [][]byte{nil, []byte("1500"), []byte("15005"), []byte("0000"), []byte("9"),
				[]byte("/registry/pods/namespace-default/pod-with-a-long-name-1500"), []byte("/registry/pods/namespace-default/pod-with-a-long-name-0"),
				[]byte("/registry/pods/namespace-default/pod"), []byte("/registry/pods/namespace-default/zzz"), []byte("/registry/pods/namespace-defaul2")} {
				got, want := dump(v.root, rev, from), modelDump(v.m, rev, from)
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("version %d reverse=%v from=%q: got %d items, want %d", i, rev, from, len(got), len(want))
				}
			}
		}
		for k, want := range v.m {
			if got, ok := lookup(v.root, []byte(k)); !ok || string(got) != want {
				t.Fatalf("version %d: lookup(%q) = %q, %v; want %q", i, k, got, ok, want)
			}
		}
	}
	if len(m) == 0 {
		t.Fatalf("model emptied; the test no longer exercises deep trees")
	}
}

// TestCompareKeys checks the word-at-a-time comparisons against the bytes
// package on keys that differ at every position and in length, and the
// common prefix compareFrom reports when told where to start.
func TestCompareKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	base := []byte("/registry/pods/default/pod-0500-with-a-longer-tail")
	for n := 0; n <= len(base); n++ {
		a := base[:n]
		for m := 0; m <= len(base); m++ {
			b := bytes.Clone(base[:m])
			for range 4 {
				if m > 0 && rng.IntN(2) == 0 {
					b[rng.IntN(m)] = byte(rng.IntN(256))
				}
				if got, want := compareKeys(a, b), bytes.Compare(a, b); got != want {
					t.Fatalf("compareKeys(%q, %q) = %d, want %d", a, b, got, want)
				}
				if got, want := equalKeys(a, b), bytes.Equal(a, b); got != want {
					t.Fatalf("equalKeys(%q, %q) = %v, want %v", a, b, got, want)
				}
				lcp := 0
				for lcp < min(len(a), len(b)) && a[lcp] == b[lcp] {
					lcp++
				}
				from := rng.IntN(lcp + 1)
				if c, l := compareFrom(a, b, from); c != bytes.Compare(a, b) || l != lcp {
					t.Fatalf("compareFrom(%q, %q, %d) = %d, %d; want %d, %d", a, b, from, c, l, bytes.Compare(a, b), lcp)
				}
			}
		}
	}
}

// TestScanSnapshot: a scan keeps seeing the data of when it opened while
// commits change and delete what it has not read yet.
func TestScanSnapshot(t *testing.T) {
	ctx := context.Background()
	s := &store{}
	if _, err := s.Init(ctx, nil, sdk.HostInfo{}); err != nil {
		t.Fatal(err)
	}
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
	s := &store{}
	if _, err := s.Init(ctx, nil, sdk.HostInfo{}); err != nil {
		t.Fatal(err)
	}
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

// TestReadersFreezeLazily: a reader released before the next change
// freezes nothing (the change mutates in place, as the common one-call scan
// must cost no copying), and one still open keeps its version.
func TestReadersFreezeLazily(t *testing.T) {
	var tr tree
	for i := range 1000 {
		tr.set(item{key: fmt.Appendf(nil, "k%04d", i), value: []byte("a")})
	}
	root, gen := tr.read()
	tr.release(gen)
	tr.set(item{key: []byte("k0500"), value: []byte("b")})
	if tr.gen != gen || tr.root != root {
		t.Fatalf("a change after a released reader copied the tree (generation %d -> %d)", gen, tr.gen)
	}
	root, gen = tr.read()
	tr.set(item{key: []byte("k0500"), value: []byte("c")})
	if tr.gen == gen || tr.root == root {
		t.Fatal("a change with a reader open mutated its version")
	}
	if v, _ := lookup(root, []byte("k0500")); string(v) != "b" {
		t.Fatalf("the open reader sees %q, want b", v)
	}
	if v, _ := lookup(tr.root, []byte("k0500")); string(v) != "c" {
		t.Fatalf("the tree holds %q, want c", v)
	}
}
