package main

import "unsafe"

// index finds a key's current value without searching the tree: Get and the
// conditions of a commit only ever need the latest version. perf of the
// Get path put the tree search at half of the guest's time (a binary
// search per level, each probe a call and a key comparison, and Go calls
// are expensive in wasm); a hash probe costs one pass over the key to hash
// it and one to compare it.
//
// It is an open-addressing table with linear probing and backward-shift
// deletion, at most half full. A slot refers to the pair's single
// allocation (the key followed by the value, as Commit stores them), so it
// costs 32 bytes and keeps the memory alive only as long as the tree does.
type index struct {
	slots []slot
	count int
}

type slot struct {
	pair []byte // the key followed by the value; nil = empty
	klen uint32
	hash uint32
}

func (s *slot) key() []byte   { return s.pair[:s.klen:s.klen] }
func (s *slot) value() []byte { return s.pair[s.klen:] }

// hashKey mixes a key eight bytes at a time, with one 64-bit multiply per
// word (wasm has no 64x64->128 multiply, which wyhash-style mixing needs).
// It only spreads keys over the table: a collision costs a comparison.
func hashKey(b []byte) uint32 {
	const m = 0x9e3779b97f4a7c15
	h := uint64(len(b)) * m
	p := unsafe.Pointer(unsafe.SliceData(b))
	n := len(b)
	for ; n >= 8; n -= 8 {
		h = (h ^ *(*uint64)(p)) * m
		h ^= h >> 32
		p = unsafe.Add(p, 8)
	}
	var t uint64
	for i := 0; i < n; i++ {
		t = t<<8 | uint64(*(*byte)(unsafe.Add(p, i)))
	}
	h = (h ^ t) * m
	return uint32(h>>32) ^ uint32(h)
}

// get returns key's value.
func (x *index) get(key []byte) ([]byte, bool) {
	if x.count == 0 {
		return nil, false
	}
	h := hashKey(key)
	mask := len(x.slots) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.pair == nil {
			return nil, false
		}
		if s.hash == h && equalKeys(s.key(), key) {
			return s.value(), true
		}
	}
}

// set records it, whose key and value must be one allocation, the key
// first.
func (x *index) set(it item) {
	if 2*(x.count+1) > len(x.slots) {
		x.grow()
	}
	// The item's key and value are adjacent slices of one allocation.
	pair := unsafe.Slice(unsafe.SliceData(it.key), len(it.key)+len(it.value))
	x.put(slot{pair: pair, klen: uint32(len(it.key)), hash: hashKey(it.key)})
}

func (x *index) put(n slot) {
	mask := len(x.slots) - 1
	for i := int(n.hash) & mask; ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.pair == nil {
			*s = n
			x.count++
			return
		}
		if s.hash == n.hash && s.klen == n.klen && equalKeys(s.key(), n.key()) {
			*s = n
			return
		}
	}
}

func (x *index) grow() {
	old := x.slots
	x.slots = make([]slot, max(64, 2*len(old)))
	x.count = 0
	for i := range old {
		if old[i].pair != nil {
			x.put(old[i])
		}
	}
}

// remove forgets key, shifting back the slots of its probe run so that
// lookups never meet a hole before their key.
func (x *index) remove(key []byte) {
	if x.count == 0 {
		return
	}
	h := hashKey(key)
	mask := len(x.slots) - 1
	i := int(h) & mask
	for {
		s := &x.slots[i]
		if s.pair == nil {
			return
		}
		if s.hash == h && equalKeys(s.key(), key) {
			break
		}
		i = (i + 1) & mask
	}
	x.count--
	// Backward shift: move each later slot of the run into the hole if
	// its home position is not between the hole and itself.
	hole := i
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := &x.slots[j]
		if s.pair == nil {
			break
		}
		// The slot may fill the hole if the hole lies on its probe
		// path, from its home to where it sits.
		home := int(s.hash) & mask
		if (j-home)&mask >= (j-hole)&mask {
			x.slots[hole] = *s
			hole = j
		}
	}
	x.slots[hole] = slot{}
}
