package btree

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
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
			if prev != nil && bytes.Compare(prev, it.Key) >= 0 {
				t.Fatalf("keys out of order: %q then %q", prev, it.Key)
			}
			prev = it.Key
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

// checkWalk walks v (name, in failures) with Next alone from the bound
// from (forward: the first key >= from; reverse: the last key < from; an
// empty from: the first or last key) and checks every item against the
// model m, whose keys are sorted in keys.
func checkWalk(t *testing.T, name string, v Version, m map[string]string, keys []string, reverse bool, from []byte) {
	t.Helper()
	want := keys
	if len(from) > 0 {
		i, _ := slices.BinarySearch(keys, string(from))
		if reverse {
			want = keys[:i]
		} else {
			want = keys[i:]
		}
	}
	var c Cursor
	if reverse {
		c.SeekLT(v, from)
	} else {
		c.SeekGE(v, from)
	}
	for n := 0; ; n++ {
		it, ok := c.Next()
		if n == len(want) {
			if ok {
				t.Fatalf("%s, reverse=%v from=%q: item %d is %q, want the end", name, reverse, from, n, it.Key)
			}
			return
		}
		k := want[n]
		if reverse {
			k = want[len(want)-1-n]
		}
		if !ok {
			t.Fatalf("%s, reverse=%v from=%q: the walk ends after %d items, want %d", name, reverse, from, n, len(want))
		}
		if string(it.Key) != k || string(it.Value) != m[k] {
			t.Fatalf("%s, reverse=%v from=%q: item %d is %q=%q, want %q=%q", name, reverse, from, n, it.Key, it.Value, k, m[k])
		}
	}
}

// TestTreeAgainstModel applies random changes and checks every kept
// version against a map, including versions taken long ago: a change that
// mutated a frozen node would corrupt an old version. It runs the tree as
// each memkv does: frozen after every batch of changes (the native adaptor
// publishes a version per commit), and with readers taken and released at
// random points (the wasm plugin's scans), so changes run both in place and
// by path copying.
func TestTreeAgainstModel(t *testing.T) {
	for _, freezeEveryBatch := range []bool{true, false} {
		t.Run(fmt.Sprintf("freezeEveryBatch=%v", freezeEveryBatch), func(t *testing.T) {
			testTreeAgainstModel(t, freezeEveryBatch)
		})
	}
}

func testTreeAgainstModel(t *testing.T, freezeEveryBatch bool) {
	rng := rand.New(rand.NewPCG(42, 1))
	m := map[string]string{}
	var tr Tree
	// Keys with long shared prefixes, prefixes of one another, and none:
	// the searches skip the bytes they know are shared.
	prefixes := []string{"", "/registry/pods/namespace-default/pod-with-a-long-name-", "/registry/pods/namespace-default/pod-with-a-long-name-0", "/registry/pods/namespace-default/", "/registry/pods/namespace-defaul"}
	type version struct {
		v Version
		m map[string]string
	}
	var versions []version
	for round := range 400 {
		// Bias toward inserts early and deletes late, so the tree grows
		// several levels and then shrinks through every rebalancing path.
		ops := 1 + rng.IntN(60)
		for range ops {
			k := fmt.Sprintf("%s%04d", prefixes[rng.IntN(len(prefixes))], rng.IntN(3000))
			if rng.IntN(400) < round {
				tr.Delete([]byte(k))
				delete(m, k)
			} else {
				v := fmt.Sprint(round)
				tr.Set([]byte(k), []byte(v))
				m[k] = v
			}
		}
		if n := checkTree(t, tr.root); n != len(m) {
			t.Fatalf("round %d: tree holds %d keys, model %d", round, n, len(m))
		}
		if freezeEveryBatch {
			v := tr.Freeze()
			if round%20 == 0 {
				versions = append(versions, version{v, maps.Clone(m)})
			}
			continue
		}
		switch rng.IntN(10) {
		case 0:
			// A version kept to the end: frozen at once, or left to the
			// next change to freeze (a reader that stays open).
			var v Version
			if rng.IntN(2) == 0 {
				v = tr.Freeze()
			} else {
				v = tr.Read()
			}
			versions = append(versions, version{v, maps.Clone(m)})
		case 1, 2:
			// A reader released before the next change: it freezes
			// nothing, and the changes that follow mutate in place.
			v := tr.Read()
			checkWalk(t, fmt.Sprintf("round %d: a reader", round), v, m, slices.Sorted(maps.Keys(m)), false, nil)
			tr.Release(v)
		}
	}
	versions = append(versions, version{tr.Freeze(), m})
	for i, v := range versions {
		keys := slices.Sorted(maps.Keys(v.m))
		for _, rev := range []bool{false, true} {
			for _, from := range [][]byte{nil, []byte("1500"), []byte("15005"), []byte("0000"), []byte("9"),
				[]byte("/registry/pods/namespace-default/pod-with-a-long-name-1500"), []byte("/registry/pods/namespace-default/pod-with-a-long-name-0"),
				[]byte("/registry/pods/namespace-default/pod"), []byte("/registry/pods/namespace-default/zzz"), []byte("/registry/pods/namespace-defaul2")} {
				checkWalk(t, fmt.Sprintf("version %d", i), v.v, v.m, keys, rev, from)
			}
		}
		for k, want := range v.m {
			if got, ok := v.v.Get([]byte(k)); !ok || string(got) != want {
				t.Fatalf("version %d: Get(%q) = %q, %v; want %q", i, k, got, ok, want)
			}
		}
	}
	for k, want := range m {
		if got, ok := tr.Get([]byte(k)); !ok || string(got) != want {
			t.Fatalf("live tree: Get(%q) = %q, %v; want %q", k, got, ok, want)
		}
	}
	if len(m) == 0 {
		t.Fatalf("model emptied; the test no longer exercises deep trees")
	}
}

// TestCompare checks the word-at-a-time comparisons against the bytes
// package on keys that differ at every position and in length, and the
// common prefix compareFrom reports when told where to start.
func TestCompare(t *testing.T) {
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
				if got, want := Compare(a, b), bytes.Compare(a, b); got != want {
					t.Fatalf("Compare(%q, %q) = %d, want %d", a, b, got, want)
				}
				if got, want := Equal(a, b), bytes.Equal(a, b); got != want {
					t.Fatalf("Equal(%q, %q) = %v, want %v", a, b, got, want)
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

// TestBounds seeks to every key and to every gap between keys, in both
// directions, and walks a short range from there, forward both with Next
// alone and in NextRun's runs of every length. Key x of the tree is
// boundKey(x) for every even x, so the expected keys follow from x alone,
// and the bounds fall inside leaves, on separators and after every key.
func TestBounds(t *testing.T) {
	const n = 3000
	var tr Tree
	for x := 0; x < 2*n; x += 2 {
		tr.Set(boundKey(x), boundKey(x))
	}
	v := tr.Freeze()
	var c Cursor
	for x := 0; x <= 2*n; x++ {
		span := 1 + x*7%61
		// Forward over [x, x+span), in runs of up to runLen items when
		// runLen > 0.
		runLen := x % 40
		c.SeekGE(v, boundKey(x))
		end := boundKey(x + span)
		next := x + x%2 // the first even key >= x
		for {
			var got []Item
			if runLen > 0 {
				run, past := c.NextRun(runLen, end)
				got = run
				if len(run) == 0 && !past {
					if it, ok := c.Next(); ok && Compare(it.Key, end) < 0 {
						got = []Item{*it}
					}
				}
			} else if it, ok := c.Next(); ok && Compare(it.Key, end) < 0 {
				got = []Item{*it}
			}
			if len(got) == 0 {
				break
			}
			if runLen > 0 && len(got) > runLen {
				t.Fatalf("forward from %d: a run of %d items, at most %d asked", x, len(got), runLen)
			}
			for _, it := range got {
				if next >= x+span {
					t.Fatalf("forward from %d (runs of %d): %q is past the end %q", x, runLen, it.Key, end)
				}
				if want := boundKey(next); !bytes.Equal(it.Key, want) || !bytes.Equal(it.Value, want) {
					t.Fatalf("forward from %d (runs of %d): %q=%q, want %q", x, runLen, it.Key, it.Value, want)
				}
				next += 2
			}
		}
		if wantEnd := min(x+span, 2*n); next < wantEnd {
			t.Fatalf("forward from %d to %d: stopped before %d", x, x+span, next)
		}
		// Backward over [x-span, x).
		c.SeekLT(v, boundKey(x))
		prev := x - 1 - (x-1)%2 // the last even key < x
		if x == 0 {
			prev = -2
		}
		for {
			it, ok := c.Next()
			if !ok || bytes.Compare(it.Key, boundKey(max(x-span, 0))) < 0 {
				break
			}
			if want := boundKey(prev); prev < 0 || !bytes.Equal(it.Key, want) {
				t.Fatalf("backward from %d: %q, want %q", x, it.Key, want)
			}
			prev -= 2
		}
		if prev >= max(x-span, 0) {
			t.Fatalf("backward from %d to %d: stopped after %d", x, x-span, prev+2)
		}
		if run, past := c.NextRun(10, nil); len(run) > 0 || past {
			t.Fatalf("NextRun on a reverse cursor: %d items, past %v", len(run), past)
		}
	}
	c.Reset()
}

func boundKey(x int) []byte { return fmt.Appendf(nil, "/registry/pods/ns/p%05d", x) }

// TestReadersFreezeLazily: a reader released before the next change
// freezes nothing (the change mutates in place, as the common one-call scan
// must cost no copying), and one still open keeps its version.
func TestReadersFreezeLazily(t *testing.T) {
	var tr Tree
	for i := range 1000 {
		tr.Set(fmt.Appendf(nil, "k%04d", i), []byte("a"))
	}
	v := tr.Read()
	tr.Release(v)
	tr.Set([]byte("k0500"), []byte("b"))
	if tr.gen != v.gen || tr.root != v.root {
		t.Fatalf("a change after a released reader copied the tree (generation %d -> %d)", v.gen, tr.gen)
	}
	v = tr.Read()
	tr.Set([]byte("k0500"), []byte("c"))
	if tr.gen == v.gen || tr.root == v.root {
		t.Fatal("a change with a reader open mutated its version")
	}
	if got, _ := v.Get([]byte("k0500")); string(got) != "b" {
		t.Fatalf("the open reader sees %q, want b", got)
	}
	if got, _ := tr.Get([]byte("k0500")); string(got) != "c" {
		t.Fatalf("the tree holds %q, want c", got)
	}
}

// TestFrozenVersionsReadConcurrently reads frozen versions from other
// goroutines while the tree changes, as the native adaptor's lock-free Get
// and Scan do: under the race detector, a change that wrote to a node of a
// frozen version fails the test.
func TestFrozenVersionsReadConcurrently(t *testing.T) {
	var tr Tree
	for i := range 2000 {
		tr.Set(fmt.Appendf(nil, "k%05d", i), []byte("0"))
	}
	var mu sync.Mutex
	published := tr.Freeze()
	var wg sync.WaitGroup
	done := make(chan struct{})
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				mu.Lock()
				v := published
				mu.Unlock()
				n := 0
				var c Cursor
				c.SeekGE(v, nil)
				for _, ok := c.Next(); ok; _, ok = c.Next() {
					n++
				}
				if _, ok := v.Get([]byte("k01000")); !ok || n < 1000 {
					t.Errorf("a frozen version lost keys: %d walked", n)
					return
				}
			}
		})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 300 {
		for range 20 {
			k := fmt.Appendf(nil, "k%05d", 1001+rng.IntN(3000))
			if rng.IntN(2) == 0 {
				tr.Delete(k)
			} else {
				tr.Set(k, fmt.Append(nil, round))
			}
		}
		v := tr.Freeze()
		mu.Lock()
		published = v
		mu.Unlock()
	}
	close(done)
	wg.Wait()
}

// TestSetAndDeleteReturnWhatTheyReplace: Set returns the item it replaced
// and Delete the item it removed, wherever in the tree the key sits
// (leaves and inner nodes, across splits and merges), as a map would.
func TestSetAndDeleteReturnWhatTheyReplace(t *testing.T) {
	var tr Tree
	model := map[string]string{}
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range 20000 {
		k := fmt.Sprintf("k%05d", rng.IntN(3000))
		want, had := model[k]
		if rng.IntN(3) == 0 {
			old, ok := tr.Delete([]byte(k))
			if ok != had || string(old.Value) != want || (ok && string(old.Key) != k) {
				t.Fatalf("op %d: Delete(%s) = %q/%q, %v; want %q, %v", i, k, old.Key, old.Value, ok, want, had)
			}
			delete(model, k)
			continue
		}
		v := fmt.Sprintf("v%d", i)
		old, ok := tr.Set([]byte(k), []byte(v))
		if ok != had || string(old.Value) != want || (ok && string(old.Key) != k) {
			t.Fatalf("op %d: Set(%s) replaced %q/%q, %v; want %q, %v", i, k, old.Key, old.Value, ok, want, had)
		}
		model[k] = v
	}
}
