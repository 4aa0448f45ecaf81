// Package btree is the ordered map of Engram's in-memory engines: the
// native adaptor engines/memkv and the wasm test plugin wasm/testplugins/memkv
// both keep their data in it, so that a fix to one is a fix to both.
//
// It owns a B-tree of byte keys made persistent by path copying, with
// versions that later changes cannot disturb, and the key comparison the
// tree orders by. It must stay a module of its own that imports nothing but
// the standard library and builds for GOOS=wasip1: a plugin links only the
// SDK and what it can take with it. It must not learn about the kv
// contract, conditions or locking; its callers own those.
//
// Every node records the generation that created it. A change mutates in
// place the nodes of the tree's current generation and copies every other
// node it touches into that generation. Freeze ends the generation, so
// every node reachable from the version it returns is never mutated again:
// a version is just a root pointer. A reader that is likely to finish
// before the next change (a scan within one plugin call) takes its version
// with Read instead, which ends the generation only if the reader is still
// open when the tree next changes; then changes keep mutating in place and
// allocate nothing but what they store (why: DESIGN.md, "The in-memory tree
// in wasm"). This is the copy-on-write scheme of github.com/google/btree,
// specialised to byte keys so that it needs no interface calls and no
// dependency.
package btree

const (
	degree   = 16
	maxItems = 2*degree - 1
	minItems = degree - 1
)

// Item is a key and its value. The tree keeps the slices it is given and
// hands them out to readers: nobody may modify them afterwards.
type Item struct {
	Key   []byte
	Value []byte
}

type node struct {
	items    []Item
	children []*node // nil for leaves
	gen      uint64
}

// Tree is the live version of the map. The zero value is an empty tree.
// Its methods must not be called concurrently with each other; versions
// may be read concurrently with the tree's changes.
type Tree struct {
	root    *node
	gen     uint64 // the generation whose nodes changes may mutate
	readers int    // readers of gen still open
}

// Version is a version of the tree: what it holds does not change while it
// is frozen (every version Freeze returns, and a Read version until it is
// released). The zero value is empty.
type Version struct {
	root *node
	gen  uint64
}

// Freeze returns the current version, frozen for good: later changes copy
// the nodes they touch instead of mutating them.
func (t *Tree) Freeze() Version {
	v := Version{t.root, t.gen}
	t.gen++
	t.readers = 0
	return v
}

// Read returns the current version for a reader, which must call Release
// when done with it. The version is frozen only if the tree changes while
// the reader is open, so a reader released before the next change costs
// that change no copying.
func (t *Tree) Read() Version {
	t.readers++
	return Version{t.root, t.gen}
}

// Release ends a reader that Read returned v to.
func (t *Tree) Release(v Version) {
	if v.gen == t.gen && t.readers > 0 {
		t.readers--
	}
}

// beforeChange ends the generation if readers of it are open, so that they
// keep their version.
func (t *Tree) beforeChange() {
	if t.readers > 0 {
		t.Freeze()
	}
}

// Get returns key's value in the live tree.
func (t *Tree) Get(key []byte) ([]byte, bool) { return lookup(t.root, key) }

// Get returns key's value in the version.
func (v Version) Get(key []byte) ([]byte, bool) { return lookup(v.root, key) }

// search returns the index of the first item whose key is >= key, whether
// that item's key equals key, and how many leading bytes key shares with
// every key in the child at that index (the child before that item). skip
// is the number of leading bytes key is known to share with every key of
// items (0 at the root).
//
// It is a binary search that remembers the common prefix of key with the
// range's lower and upper bounds: every key between the bounds shares at
// least the shorter of the two with key, so a probe compares from there.
// Keys in one part of the tree share long prefixes (Kubernetes keys: 60
// bytes and more), so a probe compares a word or two instead of the whole
// prefix.
func search(items []Item, key []byte, skip int) (int, bool, int) {
	lo, hi := 0, len(items)
	lcpLo, lcpHi := skip, skip
	for lo < hi {
		h := int(uint(lo+hi) >> 1)
		c, l := compareFrom(items[h].Key, key, min(lcpLo, lcpHi))
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
			return n.items[i].Value, true
		}
		if n.children == nil {
			break
		}
		n, skip = n.children[i], lcp
	}
	return nil, false
}

func newNode(gen uint64, leaf bool) *node {
	n := &node{gen: gen, items: make([]Item, 0, maxItems)}
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
func (n *node) split(i int, gen uint64) (Item, *node) {
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

func insertItem(s []Item, i int, it Item) []Item {
	s = append(s, Item{})
	copy(s[i+1:], s[i:])
	s[i] = it
	return s
}

func removeItem(s []Item, i int) []Item {
	copy(s[i:], s[i+1:])
	s[len(s)-1] = Item{}
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

// Set inserts key with value, or replaces key's value. The tree keeps both
// slices (see Item). It returns the item replaced, if any, so that a
// caller keeping accounts (bytes held) needs no lookup of its own.
func (t *Tree) Set(key, value []byte) (old Item, replaced bool) {
	it := Item{Key: key, Value: value}
	t.beforeChange()
	if t.root == nil {
		t.root = newNode(t.gen, true)
		t.root.items = append(t.root.items, it)
		return Item{}, false
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
		i, found, lcp := search(n.items, key, skip)
		if found {
			old, n.items[i] = n.items[i], it
			return old, true
		}
		if n.children == nil {
			n.items = insertItem(n.items, i, it)
			return Item{}, false
		}
		skip = lcp
		if len(n.children[i].items) >= maxItems {
			mid, right := n.mutableChild(i, t.gen).split(maxItems/2, t.gen)
			n.items = insertItem(n.items, i, mid)
			n.children = insertChild(n.children, i+1, right)
			switch c := Compare(key, mid.Key); {
			case c == 0:
				old, n.items[i] = n.items[i], it
				return old, true
			case c > 0:
				i++
			}
			// The child's bounds changed: compare from the start.
			skip = 0
		}
		n = n.mutableChild(i, t.gen)
	}
}

// Delete removes key if present and returns the item removed. It copies
// the path to where key would be even when key is absent: a caller that
// knows key is absent should not call it.
func (t *Tree) Delete(key []byte) (old Item, deleted bool) {
	if t.root == nil {
		return Item{}, false
	}
	t.beforeChange()
	t.root = t.root.mutable(t.gen)
	old, deleted = t.root.remove(key, false, t.gen)
	if len(t.root.items) == 0 {
		if t.root.children != nil {
			t.root = t.root.children[0]
		} else {
			t.root = nil
		}
	}
	return old, deleted
}

// remove deletes key (or, with max set, the largest item) from the subtree
// of the mutable node n. It tops up a child before descending into it, so
// that the child can lose an item without underflowing.
func (n *node) remove(key []byte, max bool, gen uint64) (Item, bool) {
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
				return Item{}, false
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
func (n *node) growChildAndRemove(i int, key []byte, max bool, gen uint64) (Item, bool) {
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
