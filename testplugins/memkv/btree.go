package main

import "unsafe"

// The tree is a B-tree made persistent by path copying, the scheme of
// plugins/memkv (the native adaptor), copied rather than imported because a
// plugin links only the SDK. It is specialised for Go compiled to wasm,
// where a function call, an interface call and a byte loop cost several
// times what they do natively (a bytes.Compare of two 31-byte keys with a
// long common prefix: 82 ns, bytes.Equal: 161 ns, against 5 ns natively):
// keys are compared a machine word at a time, nothing is called through a
// closure or an interface, and nodes are owned by a generation number
// rather than by an allocated token.
//
// Every node records the generation that created it. A commit mutates in
// place the nodes of the current generation and copies every other node it
// touches into the current generation. A reader (a scan) that is still open
// when the tree is next changed ends the generation first, so every node it
// can reach is never mutated again. Most scans end within the call that
// opened them (no commit can run in between in a single-threaded
// instance): they freeze nothing, and commits keep mutating in place and
// allocate nothing but the items they store. Freezing on every scan made
// the next commit copy its whole path, node by node (perf of the update
// workload: node copies were most of the guest's allocation and page
// faults).

const (
	degree   = 16
	maxItems = 2*degree - 1
	minItems = degree - 1
)

type item struct {
	key   []byte
	value []byte
}

type node struct {
	items    []item
	children []*node // nil for leaves
	gen      uint64
}

// compareKeys is bytes.Compare, eight bytes at a time. wasm has no vector
// compare, and Go's wasm bytealg loops over single bytes in globals.
func compareKeys(a, b []byte) int {
	c, _ := compareFrom(a, b, 0)
	return c
}

// compareFrom compares a and b, whose first from bytes are known to be
// equal, and also returns the length of their common prefix. Keys in one
// part of the tree share long prefixes (Kubernetes keys: 60 bytes and
// more), so a search that skips what it already knows is equal compares a
// word or two per probe instead of the whole prefix.
func compareFrom(a, b []byte, from int) (int, int) {
	n := min(len(a), len(b))
	pa, pb := unsafe.Pointer(unsafe.SliceData(a)), unsafe.Pointer(unsafe.SliceData(b))
	i := from
	for ; i+8 <= n; i += 8 {
		if *(*uint64)(unsafe.Add(pa, i)) != *(*uint64)(unsafe.Add(pb, i)) {
			// The first differing byte is in this word; finding it byte by
			// byte keeps the order independent of endianness.
			break
		}
	}
	for ; i < n; i++ {
		x, y := *(*byte)(unsafe.Add(pa, i)), *(*byte)(unsafe.Add(pb, i))
		if x != y {
			if x < y {
				return -1, i
			}
			return 1, i
		}
	}
	switch {
	case len(a) < len(b):
		return -1, n
	case len(a) > len(b):
		return 1, n
	}
	return 0, n
}

// equalKeys is bytes.Equal, eight bytes at a time.
func equalKeys(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	pa, pb := unsafe.Pointer(unsafe.SliceData(a)), unsafe.Pointer(unsafe.SliceData(b))
	n, i := len(a), 0
	for ; i+8 <= n; i += 8 {
		if *(*uint64)(unsafe.Add(pa, i)) != *(*uint64)(unsafe.Add(pb, i)) {
			return false
		}
	}
	for ; i < n; i++ {
		if *(*byte)(unsafe.Add(pa, i)) != *(*byte)(unsafe.Add(pb, i)) {
			return false
		}
	}
	return true
}

// search returns the index of the first item whose key is >= key, whether
// that item's key equals key, and how many leading bytes key shares with
// every key in the child at that index (the child before that item). skip is the number of leading bytes
// key is known to share with every key of items (0 at the root).
//
// It is a binary search that remembers the common prefix of key with the
// range's lower and upper bounds: every key between the bounds shares at
// least the shorter of the two with key, so a probe compares from there.
func search(items []item, key []byte, skip int) (int, bool, int) {
	lo, hi := 0, len(items)
	lcpLo, lcpHi := skip, skip
	for lo < hi {
		h := int(uint(lo+hi) >> 1)
		c, l := compareFrom(items[h].key, key, min(lcpLo, lcpHi))
		if c == 0 {
			// The child at h lies between the lower bound and this item.
			return h, true, min(lcpLo, l)
		}
		if c < 0 {
			lo, lcpLo = h+1, l
		} else {
			hi, lcpHi = h, l
		}
	}
	return lo, false, min(lcpLo, lcpHi)
}

// lookup finds key in the tree rooted at n.
func lookup(n *node, key []byte) ([]byte, bool) {
	skip := 0
	for n != nil {
		i, found, lcp := search(n.items, key, skip)
		if found {
			return n.items[i].value, true
		}
		if n.children == nil {
			break
		}
		n, skip = n.children[i], lcp
	}
	return nil, false
}

func newNode(gen uint64, leaf bool) *node {
	n := &node{gen: gen, items: make([]item, 0, maxItems)}
	if !leaf {
		n.children = make([]*node, 0, maxItems+1)
	}
	return n
}

// mutable returns n itself if it belongs to generation gen, else a copy
// that does. Copies get full capacity so later inserts never reallocate.
func (n *node) mutable(gen uint64) *node {
	if n.gen == gen {
		return n
	}
	c := newNode(gen, n.children == nil)
	c.items = append(c.items, n.items...)
	if n.children != nil {
		c.children = append(c.children, n.children...)
	}
	return c
}

// mutableChild makes child i of the mutable node n mutable.
func (n *node) mutableChild(i int, gen uint64) *node {
	c := n.children[i].mutable(gen)
	n.children[i] = c
	return c
}

// split moves the items after i (and their children) into a new node and
// returns item i, which the caller lifts into the parent. n must be mutable.
func (n *node) split(i int, gen uint64) (item, *node) {
	mid := n.items[i]
	r := newNode(gen, n.children == nil)
	r.items = append(r.items, n.items[i+1:]...)
	clear(n.items[i:]) // drop references so dropped values can be collected
	n.items = n.items[:i]
	if n.children != nil {
		r.children = append(r.children, n.children[i+1:]...)
		clear(n.children[i+1:])
		n.children = n.children[:i+1]
	}
	return mid, r
}

func insertItem(s []item, i int, it item) []item {
	s = append(s, item{})
	copy(s[i+1:], s[i:])
	s[i] = it
	return s
}

func removeItem(s []item, i int) []item {
	copy(s[i:], s[i+1:])
	s[len(s)-1] = item{}
	return s[:len(s)-1]
}

func insertChild(s []*node, i int, c *node) []*node {
	s = append(s, nil)
	copy(s[i+1:], s[i:])
	s[i] = c
	return s
}

func removeChild(s []*node, i int) []*node {
	copy(s[i:], s[i+1:])
	s[len(s)-1] = nil
	return s[:len(s)-1]
}

// tree is the live version: its root, the generation whose nodes changes
// may mutate, and the readers of that generation still open.
type tree struct {
	root    *node
	gen     uint64
	readers int
}

// read returns the current root for a reader, which must call release when
// done; until then no change mutates a node the reader can reach.
func (t *tree) read() (*node, uint64) {
	t.readers++
	return t.root, t.gen
}

// release ends a reader of generation gen.
func (t *tree) release(gen uint64) {
	if gen == t.gen && t.readers > 0 {
		t.readers--
	}
}

// snapshot returns the current root, frozen: later changes copy the nodes
// they touch instead of mutating them.
func (t *tree) snapshot() *node {
	t.gen++
	t.readers = 0
	return t.root
}

// write is called before every change: if readers of the current
// generation are open, it ends the generation so they keep their version.
func (t *tree) write() {
	if t.readers > 0 {
		t.snapshot()
	}
}

// set inserts or replaces it.
func (t *tree) set(it item) {
	t.write()
	if t.root == nil {
		t.root = newNode(t.gen, true)
		t.root.items = append(t.root.items, it)
		return
	}
	t.root = t.root.mutable(t.gen)
	if len(t.root.items) >= maxItems {
		mid, right := t.root.split(maxItems/2, t.gen)
		root := newNode(t.gen, false)
		root.items = append(root.items, mid)
		root.children = append(root.children, t.root, right)
		t.root = root
	}
	// Descend, splitting full children before entering them so that a
	// leaf always has room and no split ever has to walk back up.
	n, skip := t.root, 0
	for {
		i, found, lcp := search(n.items, it.key, skip)
		if found {
			n.items[i] = it
			return
		}
		if n.children == nil {
			n.items = insertItem(n.items, i, it)
			return
		}
		skip = lcp
		if len(n.children[i].items) >= maxItems {
			mid, right := n.mutableChild(i, t.gen).split(maxItems/2, t.gen)
			n.items = insertItem(n.items, i, mid)
			n.children = insertChild(n.children, i+1, right)
			switch c := compareKeys(it.key, mid.key); {
			case c == 0:
				n.items[i] = it
				return
			case c > 0:
				i++
			}
			// The child's bounds changed: compare from the start.
			skip = 0
		}
		n = n.mutableChild(i, t.gen)
	}
}

// remove deletes key if present.
func (t *tree) remove(key []byte) {
	if t.root == nil {
		return
	}
	t.write()
	t.root = t.root.mutable(t.gen)
	t.root.remove(key, false, t.gen)
	if len(t.root.items) == 0 {
		if t.root.children != nil {
			t.root = t.root.children[0]
		} else {
			t.root = nil
		}
	}
}

// remove deletes key (or, with max set, the largest item) from the subtree
// of the mutable node n. It tops up a child before descending into it, so
// that the child can lose an item without underflowing.
func (n *node) remove(key []byte, max bool, gen uint64) (item, bool) {
	var i int
	var found bool
	if max {
		if n.children == nil {
			last := len(n.items) - 1
			out := n.items[last]
			n.items = removeItem(n.items, last)
			return out, true
		}
		i = len(n.items)
	} else {
		i, found, _ = search(n.items, key, 0)
		if n.children == nil {
			if !found {
				return item{}, false
			}
			out := n.items[i]
			n.items = removeItem(n.items, i)
			return out, true
		}
	}
	if len(n.children[i].items) <= minItems {
		return n.growChildAndRemove(i, key, max, gen)
	}
	child := n.mutableChild(i, gen)
	if found {
		// Replace the item with its predecessor, the largest item of the
		// child to its left, which has items to spare.
		out := n.items[i]
		n.items[i], _ = child.remove(nil, true, gen)
		return out, true
	}
	return child.remove(key, max, gen)
}

// growChildAndRemove gives child i more than minItems items, by stealing
// from a sibling or merging with one, then retries the removal at n.
func (n *node) growChildAndRemove(i int, key []byte, max bool, gen uint64) (item, bool) {
	switch {
	case i > 0 && len(n.children[i-1].items) > minItems:
		child := n.mutableChild(i, gen)
		left := n.mutableChild(i-1, gen)
		stolen := left.items[len(left.items)-1]
		left.items = removeItem(left.items, len(left.items)-1)
		child.items = insertItem(child.items, 0, n.items[i-1])
		n.items[i-1] = stolen
		if left.children != nil {
			c := left.children[len(left.children)-1]
			left.children = removeChild(left.children, len(left.children)-1)
			child.children = insertChild(child.children, 0, c)
		}
	case i < len(n.items) && len(n.children[i+1].items) > minItems:
		child := n.mutableChild(i, gen)
		right := n.mutableChild(i+1, gen)
		stolen := right.items[0]
		right.items = removeItem(right.items, 0)
		child.items = append(child.items, n.items[i])
		n.items[i] = stolen
		if right.children != nil {
			c := right.children[0]
			right.children = removeChild(right.children, 0)
			child.children = append(child.children, c)
		}
	default:
		if i >= len(n.items) {
			i--
		}
		child := n.mutableChild(i, gen)
		merged := n.children[i+1]
		child.items = append(child.items, n.items[i])
		child.items = append(child.items, merged.items...)
		if merged.children != nil {
			child.children = append(child.children, merged.children...)
		}
		n.items = removeItem(n.items, i)
		n.children = removeChild(n.children, i+1)
	}
	return n.remove(key, max, gen)
}

// frame is one level of an iteration path. Forward, next is the index of
// the next item to yield in n; reverse, next-1 is.
type frame struct {
	n    *node
	next int
}

// cursor walks a snapshot in order. It holds only the path from the root,
// so it costs O(depth) memory however large the range.
type cursor struct {
	stack   []frame
	reverse bool
}

// seekGE positions a forward cursor before the first key >= start.
func (c *cursor) seekGE(root *node, start []byte) {
	c.stack = c.stack[:0]
	skip := 0
	for n := root; n != nil; {
		i, found, lcp := search(n.items, start, skip)
		c.stack = append(c.stack, frame{n, i})
		if found || n.children == nil {
			return
		}
		n, skip = n.children[i], lcp
	}
}

// seekLT positions a reverse cursor before the last key < end; an empty end
// means after the last key.
func (c *cursor) seekLT(root *node, end []byte) {
	c.stack = c.stack[:0]
	skip := 0
	for n := root; n != nil; {
		i := len(n.items)
		if len(end) > 0 {
			i, _, skip = search(n.items, end, skip)
		}
		c.stack = append(c.stack, frame{n, i})
		if n.children == nil {
			return
		}
		n = n.children[i]
	}
}

// leafRun returns, without moving, the items a forward cursor yields next
// from the leaf it is in: most of a tree's items, which a scan can then take
// in runs instead of one call and one bound check each. It returns nil for
// a reverse cursor, at the end, and when the next item is an inner node's.
func (c *cursor) leafRun() []item {
	if c.reverse || len(c.stack) == 0 {
		return nil
	}
	f := &c.stack[len(c.stack)-1]
	if f.n.children != nil || f.next >= len(f.n.items) {
		return nil
	}
	return f.n.items[f.next:]
}

// skip moves a forward cursor past the first k items of its leafRun.
func (c *cursor) skip(k int) { c.stack[len(c.stack)-1].next += k }

// next returns the next item in the cursor's direction.
func (c *cursor) next() (*item, bool) {
	for len(c.stack) > 0 {
		f := &c.stack[len(c.stack)-1]
		if c.reverse {
			if f.next > 0 {
				f.next--
				it := &f.n.items[f.next]
				if f.n.children != nil {
					// The items before it live in child f.next; walk to the
					// rightmost leaf of that child.
					for n := f.n.children[f.next]; n != nil; {
						c.stack = append(c.stack, frame{n, len(n.items)})
						if n.children == nil {
							break
						}
						n = n.children[len(n.items)]
					}
				}
				return it, true
			}
		} else if f.next < len(f.n.items) {
			it := &f.n.items[f.next]
			f.next++
			if f.n.children != nil {
				for n := f.n.children[f.next]; n != nil; {
					c.stack = append(c.stack, frame{n, 0})
					if n.children == nil {
						break
					}
					n = n.children[0]
				}
			}
			return it, true
		}
		c.stack = c.stack[:len(c.stack)-1]
	}
	return nil, false
}
