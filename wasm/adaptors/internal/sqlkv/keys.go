package sqlkv

import "crypto/sha256"

// HeadLen is how many leading key bytes a table's primary key holds.
// Engram's keys may be 60000 bytes, more than a btree index entry takes
// (about 2.7 KB in PostgreSQL, 3072 bytes in InnoDB), so the key itself
// cannot be the primary key: a table keys each row by key_head, the first
// HeadLen bytes, which orders rows (bytewise, as bytes.Compare), and
// key_tail_hash, the SHA-256 of the bytes past the head (empty for the
// usual short key), which makes long keys unique.
const HeadLen = 1024

// KeyHead is key_head of key.
func KeyHead(key []byte) []byte { return key[:min(len(key), HeadLen)] }

// KeyTailHash is key_tail_hash of key: empty for keys of HeadLen bytes or
// fewer.
func KeyTailHash(key []byte) []byte {
	if len(key) <= HeadLen {
		return nil
	}
	h := sha256.Sum256(key[HeadLen:])
	return h[:]
}

// MayShareHead reports whether another key can have key's head: only keys
// of HeadLen bytes or more, whose head is not the whole key or is a prefix
// of longer keys. Shorter keys are their own head, unique.
func MayShareHead(key []byte) bool { return len(key) >= HeadLen }

// NonNil turns a nil slice into an empty one: the contract makes a nil
// value the empty value, and drivers send nil as NULL.
func NonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// AppendCopy appends b to arena and returns the copy, capped so later
// appends cannot overwrite it.
func AppendCopy(arena *[]byte, b []byte) []byte {
	o := len(*arena)
	*arena = append(*arena, b...)
	return (*arena)[o:len(*arena):len(*arena)]
}
