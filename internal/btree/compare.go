package btree

import "unsafe"

// The tree compares keys a machine word at a time itself rather than with
// the bytes package because Go compiled to wasm has no vector compare and
// its bytealg loops over single bytes; natively the word compare, with
// search's skipping of known prefixes, is faster than bytes.Compare too
// (measurements: DESIGN.md, "The in-memory tree in wasm"). Words are read
// unaligned, which amd64, arm64 and wasm do at full speed.

// Compare is bytes.Compare, in the order the tree keeps its keys.
func Compare(a, b []byte) int {
	c, _ := compareFrom(a, b, 0)
	return c
}

// compareFrom compares a and b, whose first from bytes are known to be
// equal, and also returns the length of their common prefix.
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

// Equal is bytes.Equal, a word at a time.
func Equal(a, b []byte) bool {
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
