package memkv

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
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
	var c cursor
	c.reverse = reverse
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
		if from != nil && ((!reverse && k < string(from)) || (reverse && k >= string(from))) {
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

// TestTreeAgainstModel applies random commits and checks every published
// version against a map, including versions published long ago: a commit
// that mutated a shared node would corrupt an old snapshot.
func TestTreeAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 1))
	m := map[string]string{}
	var root *node
	type version struct {
		root *node
		m    map[string]string
	}
	var versions []version
	for round := range 400 {
		tr := tree{root: root, tok: new(token)}
		// Bias toward inserts early and deletes late, so the tree grows
		// several levels and then shrinks through every rebalancing path.
		ops := 1 + rng.IntN(60)
		for range ops {
			k := fmt.Sprintf("%04d", rng.IntN(3000))
			if rng.IntN(400) < round {
				tr.remove([]byte(k))
				delete(m, k)
			} else {
				v := fmt.Sprint(round)
				tr.set(item{key: []byte(k), value: []byte(v)})
				m[k] = v
			}
		}
		root = tr.root
		if n := checkTree(t, root); n != len(m) {
			t.Fatalf("round %d: tree holds %d keys, model %d", round, n, len(m))
		}
		if round%20 == 0 {
			cp := make(map[string]string, len(m))
			for k, v := range m {
				cp[k] = v
			}
			versions = append(versions, version{root, cp})
		}
	}
	versions = append(versions, version{root, m})
	for i, v := range versions {
		for _, rev := range []bool{false, true} {
			for _, from := range [][]byte{nil, []byte("1500"), []byte("15005"), []byte("0000"), []byte("9")} {
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
