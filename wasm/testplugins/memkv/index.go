package main

import (
	"unsafe"

	"github.com/engramkv/engram/internal/btree"
)

// index finds a key's current value without searching the tree: Get and the
// conditions of a commit only ever need the latest version, and in wasm a
// tree search (a binary search per level, each probe a call and a key
// comparison) costs far more than a hash probe, one pass over the key to
// hash it and one to compare it.
//
// It is 256 open-addressing tables (linear probing, backward-shift deletion,
// at most half full), chosen by the hash's top byte. A slot refers to the
// pair's single allocation (the key followed by the value, as Commit stores
// them), so it costs 32 bytes and keeps the memory alive only as long as the
// tree does. The shards keep growth incremental: a shard rehashes 1/256 of
// the keys when it doubles, where one table for all keys stalled a commit
// rehashing them all. (Measurements: DESIGN.md, "The in-memory tree in
// wasm".)
type index struct {
	shards [256]table
	count  int
}

type table struct {
	slots []slot
	count int
}

func (x *index) shard(h uint32) *table { return &x.shards[h>>24] }

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
	h := hashKey(key)
	t := x.shard(h)
	if t.count == 0 {
		return nil, false
	}
	mask := len(t.slots) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.pair == nil {
			return nil, false
		}
		if s.hash == h && btree.Equal(s.key(), key) {
			return s.value(), true
		}
	}
}

// set records key's value and returns the size of the pair it replaced
// (0 for a new key). key and value must be adjacent slices of one
// allocation, the key first.
func (x *index) set(key, value []byte) (replaced int) {
	pair := unsafe.Slice(unsafe.SliceData(key), len(key)+len(value))
	n := slot{pair: pair, klen: uint32(len(key)), hash: hashKey(key)}
	t := x.shard(n.hash)
	if 2*(t.count+1) > len(t.slots) {
		t.grow()
	}
	old, isNew := t.put(n)
	if isNew {
		x.count++
	}
	return len(old)
}

// put stores n, replacing the slot of the same key; it returns the pair it
// replaced and whether the key is new.
func (t *table) put(n slot) (old []byte, isNew bool) {
	mask := len(t.slots) - 1
	for i := int(n.hash) & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.pair == nil {
			*s = n
			t.count++
			return nil, true
		}
		if s.hash == n.hash && s.klen == n.klen && btree.Equal(s.key(), n.key()) {
			old = s.pair
			*s = n
			return old, false
		}
	}
}

func (t *table) grow() {
	old := t.slots
	t.slots = make([]slot, max(8, 2*len(old)))
	t.count = 0
	for i := range old {
		if old[i].pair != nil {
			t.put(old[i])
		}
	}
}

// remove forgets key, shifting back the slots of its probe run so that
// lookups never meet a hole before their key.
func (x *index) remove(key []byte) {
	h := hashKey(key)
	t := x.shard(h)
	if t.count == 0 {
		return
	}
	mask := len(t.slots) - 1
	i := int(h) & mask
	for {
		s := &t.slots[i]
		if s.pair == nil {
			return
		}
		if s.hash == h && btree.Equal(s.key(), key) {
			break
		}
		i = (i + 1) & mask
	}
	t.count--
	x.count--
	// Backward shift: move each later slot of the run into the hole if
	// its home position is not between the hole and itself.
	hole := i
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := &t.slots[j]
		if s.pair == nil {
			break
		}
		// The slot may fill the hole if the hole lies on its probe
		// path, from its home to where it sits.
		home := int(s.hash) & mask
		if (j-home)&mask >= (j-hole)&mask {
			t.slots[hole] = *s
			hole = j
		}
	}
	t.slots[hole] = slot{}
}

// shrink rehashes every shard that deletes left at most an eighth full
// into a table at most a quarter full, and returns the slots before and
// after. Tables only grow as keys come, so without it a store that held
// many keys once keeps their slots for good.
func (x *index) shrink() (before, after int) {
	for i := range x.shards {
		t := &x.shards[i]
		before += len(t.slots)
		if len(t.slots) > 8 && 8*t.count <= len(t.slots) {
			old := t.slots
			size := 8
			for size < 4*t.count {
				size *= 2
			}
			t.slots, t.count = make([]slot, size), 0
			for j := range old {
				if old[j].pair != nil {
					t.put(old[j])
				}
			}
		}
		after += len(t.slots)
	}
	return before, after
}
