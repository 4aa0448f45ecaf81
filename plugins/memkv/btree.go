package memkv

import "bytes"

// The tree is a B-tree made persistent by path copying. Every node records
// the commit (token) that created it; a commit mutates in place only the
// nodes it created itself and copies every other node it touches. Once a
// commit publishes its root, its token is never used again, so every node
// reachable from a published root is immutable and a snapshot is just a
// root pointer. This is the copy-on-write scheme of github.com/google/btree,
// specialised to byte keys so that it needs no interface calls and no
// dependency.

const (
	degree   = 16
	maxItems = 2*degree - 1
	minItems = degree - 1
)

// token identifies the commit that owns a node. It is not zero-sized, so
// that every allocation has a distinct address.
type token struct{ _ int }

type item struct {
	key   []byte
	value []byte
}

type node struct {
	items    []item
	children []*node // nil for leaves
	owner    *token
}

// search returns the index of the first item whose key is >= key, and
// whether that item's key equals key.
func search(items []item, key []byte) (int, bool) {
	lo, hi := 0, len(items)
	for lo < hi {
		h := int(uint(lo+hi) >> 1)
		if bytes.Compare(items[h].key, key) < 0 {
			lo = h + 1
		} else {
			hi = h
		}
	}
	return lo, lo < len(items) && bytes.Equal(items[lo].key, key)
}

// lookup finds key in the tree rooted at n.
func lookup(n *node, key []byte) ([]byte, bool) {
	for n != nil {
		i, found := search(n.items, key)
		if found {
			return n.items[i].value, true
		}
		if n.children == nil {
			break
		}
		n = n.children[i]
	}
	return nil, false
}

func newNode(tok *token, leaf bool) *node {
	n := &node{owner: tok, items: make([]item, 0, maxItems)}
	if !leaf {
		n.children = make([]*node, 0, maxItems+1)
	}
	return n
}

// mutable returns n itself if tok owns it, else a private copy owned by
// tok. Copies get full capacity so that later inserts never reallocate.
func (n *node) mutable(tok *token) *node {
	if n.owner == tok {
		return n
	}
	c := newNode(tok, n.children == nil)
	c.items = append(c.items, n.items...)
	if n.children != nil {
		c.children = append(c.children, n.children...)
	}
	return c
}

// mutableChild makes child i of the mutable node n mutable.
func (n *node) mutableChild(i int, tok *token) *node {
	c := n.children[i].mutable(tok)
	n.children[i] = c
	return c
}

// split moves the items after i (and their children) into a new node and
// returns item i, which the caller lifts into the parent. n must be mutable.
func (n *node) split(i int, tok *token) (item, *node) {
	mid := n.items[i]
	r := newNode(tok, n.children == nil)
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

// tree is one commit's view of the structure: the root being built and the
// token that marks the nodes this commit may mutate.
type tree struct {
	root *node
	tok  *token
}

// set inserts or replaces it.
func (t *tree) set(it item) {
	if t.root == nil {
		t.root = newNode(t.tok, true)
		t.root.items = append(t.root.items, it)
		return
	}
	t.root = t.root.mutable(t.tok)
	if len(t.root.items) >= maxItems {
		mid, right := t.root.split(maxItems/2, t.tok)
		root := newNode(t.tok, false)
		root.items = append(root.items, mid)
		root.children = append(root.children, t.root, right)
		t.root = root
	}
	// Descend, splitting full children before entering them so that a
	// leaf always has room and no split ever has to walk back up.
	n := t.root
	for {
		i, found := search(n.items, it.key)
		if found {
			n.items[i] = it
			return
		}
		if n.children == nil {
			n.items = insertItem(n.items, i, it)
			return
		}
		if len(n.children[i].items) >= maxItems {
			mid, right := n.mutableChild(i, t.tok).split(maxItems/2, t.tok)
			n.items = insertItem(n.items, i, mid)
			n.children = insertChild(n.children, i+1, right)
			switch c := bytes.Compare(it.key, mid.key); {
			case c == 0:
				n.items[i] = it
				return
			case c > 0:
				i++
			}
		}
		n = n.mutableChild(i, t.tok)
	}
}

// remove deletes key if present.
func (t *tree) remove(key []byte) {
	if t.root == nil {
		return
	}
	t.root = t.root.mutable(t.tok)
	t.root.remove(key, false, t.tok)
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
func (n *node) remove(key []byte, max bool, tok *token) (item, bool) {
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
		i, found = search(n.items, key)
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
		return n.growChildAndRemove(i, key, max, tok)
	}
	child := n.mutableChild(i, tok)
	if found {
		// Replace the item with its predecessor, the largest item of the
		// child to its left, which has items to spare.
		out := n.items[i]
		n.items[i], _ = child.remove(nil, true, tok)
		return out, true
	}
	return child.remove(key, max, tok)
}

// growChildAndRemove gives child i more than minItems items, by stealing
// from a sibling or merging with one, then retries the removal at n.
func (n *node) growChildAndRemove(i int, key []byte, max bool, tok *token) (item, bool) {
	switch {
	case i > 0 && len(n.children[i-1].items) > minItems:
		child := n.mutableChild(i, tok)
		left := n.mutableChild(i-1, tok)
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
		child := n.mutableChild(i, tok)
		right := n.mutableChild(i+1, tok)
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
		child := n.mutableChild(i, tok)
		merged := n.children[i+1]
		child.items = append(child.items, n.items[i])
		child.items = append(child.items, merged.items...)
		if merged.children != nil {
			child.children = append(child.children, merged.children...)
		}
		n.items = removeItem(n.items, i)
		n.children = removeChild(n.children, i+1)
	}
	return n.remove(key, max, tok)
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
	for n := root; n != nil; {
		i, found := search(n.items, start)
		c.stack = append(c.stack, frame{n, i})
		if found || n.children == nil {
			return
		}
		n = n.children[i]
	}
}

// seekLT positions a reverse cursor before the last key < end; a nil end
// means after the last key.
func (c *cursor) seekLT(root *node, end []byte) {
	c.stack = c.stack[:0]
	for n := root; n != nil; {
		i := len(n.items)
		if end != nil {
			i, _ = search(n.items, end)
		}
		c.stack = append(c.stack, frame{n, i})
		if n.children == nil {
			return
		}
		n = n.children[i]
	}
}

// next returns the next item in the cursor's direction.
func (c *cursor) next() (item, bool) {
	for len(c.stack) > 0 {
		f := &c.stack[len(c.stack)-1]
		if c.reverse {
			if f.next > 0 {
				f.next--
				it := f.n.items[f.next]
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
			it := f.n.items[f.next]
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
	return item{}, false
}
