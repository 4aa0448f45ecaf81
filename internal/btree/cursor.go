package btree

// frame is one level of an iteration path. Forward, next is the index of
// the next item to yield in n; reverse, next-1 is.
type frame struct {
	n    *node
	next int
}

// Cursor walks a version in key order, forward from SeekGE or backward
// from SeekLT. It holds only the path from the root, so it costs O(depth)
// memory however large the range, and it holds paths up to pathDepth deep
// without allocating. A Cursor must not be copied once positioned.
type Cursor struct {
	stack   []frame
	path    [pathDepth]frame
	reverse bool
}

// pathDepth is the depth of the path a cursor holds without allocating:
// below the root every inner node has at least degree children, so a tree
// deeper than eight levels holds billions of keys.
const pathDepth = 8

// SeekGE positions the cursor to walk v forward from the first key >= start.
func (c *Cursor) SeekGE(v Version, start []byte) {
	c.reverse = false
	c.stack = c.path[:0]
	skip := 0
	for n := v.root; n != nil; {
		i, found, lcp := search(n.items, start, skip)
		c.stack = append(c.stack, frame{n, i})
		if found || n.children == nil {
			return
		}
		n, skip = n.children[i], lcp
	}
}

// SeekLT positions the cursor to walk v backward from the last key < end;
// an empty end means from the last key.
func (c *Cursor) SeekLT(v Version, end []byte) {
	c.reverse = true
	c.stack = c.path[:0]
	skip := 0
	for n := v.root; n != nil; {
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

// Reset forgets the cursor's position, so that the nodes of the version it
// walked can be collected.
func (c *Cursor) Reset() {
	clear(c.path[:])
	c.stack = nil
}

// Next returns the next item in the cursor's direction, or false at the
// end of the version.
func (c *Cursor) Next() (*Item, bool) {
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

// NextRun returns the items a forward cursor yields next from the leaf it
// is in, at most max of them and only those before end (an empty end is no
// bound), and moves past them. Most of a tree's items are in leaves, which
// a scan can then take in runs instead of one call and one bound check
// each. past reports that the leaf holds a key >= end where the run stops,
// so the walk is over. The run is empty and past false for a reverse
// cursor, at the end, and when the next item is an inner node's: Next
// yields it.
//
// The run aliases the tree's nodes: the caller must not modify it, and may
// use it only while the cursor's version is frozen.
func (c *Cursor) NextRun(max int, end []byte) (run []Item, past bool) {
	if c.reverse || len(c.stack) == 0 || max <= 0 {
		return nil, false
	}
	f := &c.stack[len(c.stack)-1]
	if f.n.children != nil || f.next >= len(f.n.items) {
		return nil, false
	}
	run = f.n.items[f.next:]
	run = run[:min(len(run), max)]
	// One bound check, on the run's last item.
	if len(end) > 0 && Compare(run[len(run)-1].Key, end) >= 0 {
		n, _, _ := search(run, end, 0)
		run, past = run[:n], true
	}
	f.next += len(run)
	return run, past
}
