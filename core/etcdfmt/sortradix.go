package etcdfmt

import "slices"

// A batch is put in order by a least-significant-digit radix sort on two
// numbers of each index entry (its key head's halves, or its revision's),
// a byte at a time: a few passes over the batch that each move every entry
// once, where a comparison sort compares each entry about log2(n) times
// (17 for a 64 MiB batch of 600-byte rows). Bytes every entry of the batch
// shares cost no pass: revisions vary in their low three bytes, keys after
// their shared prefix in their first few. The passes move 24-byte pairs of
// numbers with the entry's position, and the entries themselves move once
// at the end.

// radixEntry is what the passes move: an index entry's two numbers, the
// first the more significant, and its place in the batch.
type radixEntry struct {
	hi, lo uint64
	at     uint32
}

// radixScratch is the memory a sort works in, kept for the next batch:
// fresh memory for every batch would be faulted in again each time. It is
// two radixEntry per row, which sortIndexOverhead counts.
type radixScratch struct {
	src, dst []radixEntry
	ties     [][2]int
}

// grow returns the scratch sized for n entries.
func (r *radixScratch) grow(n int) (src, dst []radixEntry) {
	if cap(r.src) < n {
		r.src, r.dst = make([]radixEntry, n), make([]radixEntry, n)
	}
	return r.src[:n], r.dst[:n]
}

// radixSort orders items by (hi, lo), the numbers key gives each, and
// returns where runs of equal numbers begin and end: ties, in their order
// of the batch, for the caller to settle (empty when there is none). The
// ties are valid until the next sort with r.
func radixSort(items []sortItem, r *radixScratch, key func(*sortItem) (hi, lo uint64)) (ties [][2]int) {
	n := len(items)
	if n < 2 {
		return nil
	}
	src, dst := r.grow(n)
	ties = r.ties[:0]
	defer func() { r.ties = ties[:0] }()
	var variesHi, variesLo uint64
	for i := range items {
		hi, lo := key(&items[i])
		src[i] = radixEntry{hi: hi, lo: lo, at: uint32(i)}
		variesHi |= hi ^ src[0].hi
		variesLo |= lo ^ src[0].lo
	}
	pass := func(shift int, hi bool) {
		var at [256]int
		digit := func(e *radixEntry) byte {
			if hi {
				return byte(e.hi >> shift)
			}
			return byte(e.lo >> shift)
		}
		for i := range src {
			at[digit(&src[i])]++
		}
		sum := 0
		for d, c := range at {
			at[d] = sum
			sum += c
		}
		for i := range src {
			d := digit(&src[i])
			dst[at[d]] = src[i]
			at[d]++
		}
		src, dst = dst, src
	}
	for shift := 0; shift < 64; shift += 8 {
		if byte(variesLo>>shift) != 0 {
			pass(shift, false)
		}
	}
	for shift := 0; shift < 64; shift += 8 {
		if byte(variesHi>>shift) != 0 {
			pass(shift, true)
		}
	}
	for i := 1; i < n; i++ {
		if src[i].hi == src[i-1].hi && src[i].lo == src[i-1].lo {
			if len(ties) > 0 && ties[len(ties)-1][1] == i {
				ties[len(ties)-1][1] = i + 1
			} else {
				ties = append(ties, [2]int{i - 1, i + 1})
			}
		}
	}
	permute(items, src)
	return ties
}

// moved marks a radixEntry whose item is in place.
const moved = ^uint32(0)

// permute puts items in order in place: place i takes the item that was
// at order[i].at. Each cycle of the permutation is followed once, holding
// one item aside, so no second copy of the batch is needed.
func permute(items []sortItem, order []radixEntry) {
	for i := range order {
		if order[i].at == moved {
			continue
		}
		held := items[i]
		for j := i; ; {
			k := int(order[j].at)
			order[j].at = moved
			if k == i {
				items[j] = held
				break
			}
			items[j] = items[k]
			j = k
		}
	}
}

// sortByRevision orders items by (Main, Sub); equal revisions, which Each
// refuses, stay in any order.
func sortByRevision(items []sortItem, r *radixScratch) {
	radixSort(items, r, func(it *sortItem) (uint64, uint64) {
		return uint64(it.rev.Main) ^ 1<<63, uint64(it.rev.Sub) ^ 1<<63
	})
}

// sortByHead orders items by their key heads, then those with equal heads
// by cmp (the whole keys, then the revisions).
func sortByHead(items []sortItem, r *radixScratch, cmp func(a, b sortItem) int) {
	ties := radixSort(items, r, func(it *sortItem) (uint64, uint64) { return it.head[0], it.head[1] })
	for _, t := range ties {
		slices.SortFunc(items[t[0]:t[1]], cmp)
	}
}
