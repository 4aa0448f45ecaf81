// Package coder owns Engram's internal key format: how etcd keys, revisions and
// the core's own metadata are laid out in the single ordered keyspace of a
// kv.Store.
//
// It must stay a pure, allocation-conscious byte transform: no I/O, no
// knowledge of records or values, no engine specifics.
//
// # Layout
//
// Every internal key starts with a 4-byte magic whose last byte names a space:
//
//	revision key  magic('k') + escape(key) + 0x00 0x01 + 8 zero bytes
//	object key    magic('o') + escape(key) + 0x00 0x01 + bigEndian(revision)
//	event key     magic('e') + bigEndian(revision)
//	lease key     magic('l') + bigEndian(leaseID)
//	lease index   magic('a') + bigEndian(leaseID) + escape(key) + 0x00 0x01
//	meta key      magic('m') + name
//
// A revision key (the "revision 0" slot, as in KubeBrain) holds the latest
// record of a key and is the compare-and-swap point for writes; object keys
// hold the versions later writes superseded. Unlike KubeBrain, the two live
// in separate spaces so that a read at the current revision scans only the
// latest records and never steps over history (DESIGN.md, "Reads at a
// revision").
//
// # Escaping
//
// The raw key is escaped (0x00 becomes 0x00 0xFF) and terminated by 0x00 0x01.
// This keeps the encoding order-preserving for every pair of byte strings,
// including a key that is a prefix of another: for a < b bytewise,
// escape(a)+0x00 0x01+anything sorts before escape(b)+0x00 0x01+anything.
// (KubeBrain's '$' separator breaks this: "a$..." sorts after "a\x00...", so a
// list continued from lastKey+"\x00" returns lastKey again.) The terminator
// also makes the encoding self-delimiting, so decoding never guesses where the
// key ends.
//
// Invariants (checked by fuzz tests):
//   - Decode(ObjectKey(k, r)) == (k, r) for every k and r.
//   - bytes.Compare(k1, k2) == bytes.Compare(ObjectKey(k1, r), ObjectKey(k2, r'))
//     whenever k1 != k2, for every r, r'.
//   - ObjectKey(k, r1) < ObjectKey(k, r2) iff r1 < r2 (revisions are uint64
//     big-endian; Engram's revisions are always >= 0).
package coder

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Space identifies one region of the internal keyspace.
type Space byte

// The spaces of the internal keyspace.
const (
	SpaceRevision  Space = 'k'
	SpaceObject    Space = 'o'
	SpaceEvent     Space = 'e'
	SpaceLease     Space = 'l'
	SpaceLeaseKeys Space = 'a'
	SpaceMeta      Space = 'm'
)

// magic is KubeBrain's magic minus its last byte, which names the space.
var magic = [3]byte{0x57, 0xfb, 0x80}

const (
	prefixLen  = 4
	revLen     = 8
	escByte    = 0x00
	escEscaped = 0xFF
	escTerm    = 0x01
)

// ErrMalformed is returned when a key is not a valid internal key of the
// expected space.
var ErrMalformed = errors.New("coder: malformed internal key")

// Prefix returns the 4-byte prefix of a space.
func Prefix(s Space) []byte {
	return []byte{magic[0], magic[1], magic[2], byte(s)}
}

// SpaceEnd returns the exclusive upper bound of a space.
func SpaceEnd(s Space) []byte {
	return []byte{magic[0], magic[1], magic[2], byte(s) + 1}
}

func appendPrefix(dst []byte, s Space) []byte {
	return append(dst, magic[0], magic[1], magic[2], byte(s))
}

// appendEscaped appends the escaped, terminated form of key.
func appendEscaped(dst, key []byte) []byte {
	for {
		i := bytes.IndexByte(key, escByte)
		if i < 0 {
			dst = append(dst, key...)
			break
		}
		dst = append(dst, key[:i+1]...)
		dst = append(dst, escEscaped)
		key = key[i+1:]
	}
	return append(dst, escByte, escTerm)
}

func escapedLen(key []byte) int {
	return len(key) + bytes.Count(key, []byte{escByte}) + 2
}

// unescape decodes an escaped, terminated key at the start of b and returns it
// with the remaining bytes.
func unescape(b []byte) (key, rest []byte, err error) {
	out := make([]byte, 0, len(b))
	for {
		i := bytes.IndexByte(b, escByte)
		if i < 0 || i+1 >= len(b) {
			return nil, nil, fmt.Errorf("%w: unterminated key", ErrMalformed)
		}
		out = append(out, b[:i]...)
		switch b[i+1] {
		case escTerm:
			return out, b[i+2:], nil
		case escEscaped:
			out = append(out, escByte)
			b = b[i+2:]
		default:
			return nil, nil, fmt.Errorf("%w: bad escape 0x00 0x%02x", ErrMalformed, b[i+1])
		}
	}
}

func appendRev(dst []byte, rev int64) []byte {
	return binary.BigEndian.AppendUint64(dst, uint64(rev))
}

// RevisionKey returns the revision key of an etcd key: the slot holding its
// latest record.
func RevisionKey(key []byte) []byte {
	return AppendRevisionKey(make([]byte, 0, RevisionKeyLen(key)), key)
}

// RevisionKeyLen is the length of key's revision key.
func RevisionKeyLen(key []byte) int { return prefixLen + escapedLen(key) + revLen }

// AppendRevisionKey appends key's revision key to dst (a writer building
// one buffer for several encodings saves an allocation each).
func AppendRevisionKey(dst, key []byte) []byte {
	dst = appendPrefix(dst, SpaceRevision)
	dst = appendEscaped(dst, key)
	return appendRev(dst, 0)
}

// ObjectKey returns the object key of an etcd key at a revision.
func ObjectKey(key []byte, rev int64) []byte {
	return AppendObjectKey(make([]byte, 0, ObjectKeyLen(key)), key, rev)
}

// ObjectKeyLen is the length of key's object keys.
func ObjectKeyLen(key []byte) int { return prefixLen + escapedLen(key) + revLen }

// AppendObjectKey appends the object key of key at rev to dst.
func AppendObjectKey(dst, key []byte, rev int64) []byte {
	dst = appendPrefix(dst, SpaceObject)
	dst = appendEscaped(dst, key)
	return appendRev(dst, rev)
}

// DecodeRevisionKey returns the etcd key of a revision key.
func DecodeRevisionKey(ik []byte) ([]byte, error) {
	key, rev, err := decodeKeyRev(ik, SpaceRevision)
	if err != nil {
		return nil, err
	}
	if rev != 0 {
		return nil, fmt.Errorf("%w: revision key with revision %d", ErrMalformed, rev)
	}
	return key, nil
}

// DecodeObjectKey returns the etcd key and revision of an object key.
func DecodeObjectKey(ik []byte) ([]byte, int64, error) {
	return decodeKeyRev(ik, SpaceObject)
}

func decodeKeyRev(ik []byte, s Space) ([]byte, int64, error) {
	if err := checkPrefix(ik, s); err != nil {
		return nil, 0, err
	}
	key, rest, err := unescape(ik[prefixLen:])
	if err != nil {
		return nil, 0, err
	}
	if len(rest) != revLen {
		return nil, 0, fmt.Errorf("%w: %d trailing bytes, want %d", ErrMalformed, len(rest), revLen)
	}
	return key, int64(binary.BigEndian.Uint64(rest)), nil
}

func checkPrefix(ik []byte, s Space) error {
	if len(ik) < prefixLen || ik[0] != magic[0] || ik[1] != magic[1] || ik[2] != magic[2] {
		return fmt.Errorf("%w: bad magic", ErrMalformed)
	}
	if Space(ik[3]) != s {
		return fmt.Errorf("%w: space %q, want %q", ErrMalformed, ik[3], byte(s))
	}
	return nil
}

// RevisionRange returns the internal range of revision keys for the etcd range
// [key, end). end follows etcd's conventions: empty means the single key,
// "\x00" means every key >= key.
func RevisionRange(key, end []byte) (start, stop []byte) {
	return keyRange(SpaceRevision, key, end)
}

// InRange reports whether the etcd key k lies in the etcd range [key, end),
// with the conventions of RevisionRange. It is the one statement of those
// conventions over plain keys: transaction evaluation, the watch hub and
// request validation all ask it, so they cannot disagree on a range's edge.
func InRange(k, key, end []byte) bool {
	switch {
	case len(end) == 0:
		return bytes.Equal(k, key)
	case bytes.Compare(k, key) < 0:
		return false
	case len(end) == 1 && end[0] == 0:
		return true
	default:
		return bytes.Compare(k, end) < 0
	}
}

// ObjectRange returns the internal range of object keys for the etcd range
// [key, end), with the conventions of RevisionRange.
func ObjectRange(key, end []byte) (start, stop []byte) {
	return keyRange(SpaceObject, key, end)
}

func keyRange(s Space, key, end []byte) (start, stop []byte) {
	start = appendEscaped(appendPrefix(make([]byte, 0, prefixLen+escapedLen(key)), s), key)
	switch {
	case len(end) == 0:
		// The single key: every internal key that starts with its terminated
		// form. The terminator ends in 0x01, so bumping it to 0x02 gives the
		// smallest string past all of them.
		stop = bytes.Clone(start)
		stop[len(stop)-1]++
	case len(end) == 1 && end[0] == 0:
		stop = SpaceEnd(s)
	default:
		stop = appendEscaped(appendPrefix(make([]byte, 0, prefixLen+escapedLen(end)), s), end)
	}
	return start, stop
}

// ObjectVersions returns the internal range holding the object keys of one
// etcd key with revisions in [minRev, maxRev].
func ObjectVersions(key []byte, minRev, maxRev int64) (start, stop []byte) {
	base := appendEscaped(appendPrefix(make([]byte, 0, prefixLen+escapedLen(key)+revLen+1), SpaceObject), key)
	start = appendRev(bytes.Clone(base), minRev)
	stop = appendRev(base, maxRev)
	stop = append(stop, 0x00) // inclusive of maxRev
	return start, stop
}

// EventKey returns the key of the change-log record of a revision.
func EventKey(rev int64) []byte {
	return AppendEventKey(make([]byte, 0, EventKeyLen), rev)
}

// EventKeyLen is the length of an event key.
const EventKeyLen = prefixLen + revLen

// AppendEventKey appends the event key of rev to dst.
func AppendEventKey(dst []byte, rev int64) []byte {
	return appendRev(appendPrefix(dst, SpaceEvent), rev)
}

// DecodeEventKey returns the revision of an event key.
func DecodeEventKey(ik []byte) (int64, error) {
	return decodeNumberKey(ik, SpaceEvent, "event")
}

// decodeNumberKey returns the number of a key of space s that holds one
// number and nothing else (an event's revision, a lease's ID); what names
// the key in the error.
func decodeNumberKey(ik []byte, s Space, what string) (int64, error) {
	if err := checkPrefix(ik, s); err != nil {
		return 0, err
	}
	if len(ik) != prefixLen+revLen {
		return 0, fmt.Errorf("%w: %s key of %d bytes", ErrMalformed, what, len(ik))
	}
	return int64(binary.BigEndian.Uint64(ik[prefixLen:])), nil
}

// LeaseKey returns the key of a lease record.
func LeaseKey(id int64) []byte {
	return appendRev(appendPrefix(make([]byte, 0, prefixLen+revLen), SpaceLease), id)
}

// DecodeLeaseKey returns the lease ID of a lease key.
func DecodeLeaseKey(ik []byte) (int64, error) {
	return decodeNumberKey(ik, SpaceLease, "lease")
}

// LeaseIndexKey returns the key recording that an etcd key is attached to a
// lease.
func LeaseIndexKey(id int64, key []byte) []byte {
	dst := make([]byte, 0, prefixLen+revLen+escapedLen(key))
	dst = appendRev(appendPrefix(dst, SpaceLeaseKeys), id)
	return appendEscaped(dst, key)
}

// DecodeLeaseIndexKey returns the lease ID and etcd key of a lease index key.
func DecodeLeaseIndexKey(ik []byte) (int64, []byte, error) {
	if err := checkPrefix(ik, SpaceLeaseKeys); err != nil {
		return 0, nil, err
	}
	if len(ik) < prefixLen+revLen+2 {
		return 0, nil, fmt.Errorf("%w: lease index key of %d bytes", ErrMalformed, len(ik))
	}
	id := int64(binary.BigEndian.Uint64(ik[prefixLen:]))
	key, rest, err := unescape(ik[prefixLen+revLen:])
	if err != nil {
		return 0, nil, err
	}
	if len(rest) != 0 {
		return 0, nil, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(rest))
	}
	return id, key, nil
}

// MetaKey returns the key of a named metadata record.
func MetaKey(name string) []byte {
	return append(appendPrefix(make([]byte, 0, prefixLen+len(name)), SpaceMeta), name...)
}
