// Package etcdfmt owns etcd's on-disk record format, the one inside etcd's
// bbolt backend and so inside every etcd snapshot: how a revision is written
// as a bucket key, how a key's version is written as a bucket value, how a
// lease is written, and etcd's HashKV rule over those records.
//
// Engram never stores data in this format; it speaks it at the edges: the
// Snapshot RPC and `engram snapshot restore` (packages snapshot and
// backup, the bulk import in mvcc/transfer), HashKV (package transfer) and
// migration.
// Keeping the format here, bit for bit, is what lets `etcdctl endpoint
// hashkv` agree between etcd and Engram and lets `etcdutl snapshot
// restore` accept a file Engram wrote.
//
// Files:
//
//   - etcdfmt.go: bucket names and meta keys, revisions and bucket keys,
//     Entry (one row of the key bucket), leases, and the HashKV rule
//     (Hasher, Hashed);
//   - keyvalue.go: KeyValue, the key bucket's value, with its own
//     protobuf codec that keeps fields it does not know;
//   - sort.go: Sorter, which puts entries in revision order (or in key
//     order) in bounded memory, for the edges above whose rows need not
//     fit in memory (snapshots, bulk restore, HashKV, migration).
//
// The format's encoding and decoding are pure byte transforms. The one
// I/O the package does is Sorter's: it spills sorted runs to a temporary
// file in a directory its caller names (or os.TempDir) and removes it on
// Close. It must
// not know Engram's own record layout nor touch a store. The facts below
// were checked against etcd v3.6 (server/storage/mvcc/revision.go,
// kvstore_txn.go, hash.go, key_index.go; server/lease/leasepb).
//
// # Bucket key
//
//	8-byte big-endian main revision | '_' | 8-byte big-endian sub revision [| 't']
//
// The sub revision is the change's index within its transaction; the
// trailing 't' marks a tombstone (a delete). Bucket keys sort by revision.
//
// # Bucket value
//
// A marshalled mvccpb.KeyValue (type KeyValue). A tombstone's value holds only the key.
//
// It is public because package snapshot's API is in its types, and because a
// tool that reads etcd's files needs nothing else of Engram.
package etcdfmt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"

	"google.golang.org/protobuf/encoding/protowire"
)

// Bucket names of etcd's backend that Engram reads or writes.
var (
	BucketKey   = []byte("key")
	BucketMeta  = []byte("meta")
	BucketLease = []byte("lease")
	// BucketAuth holds AuthEnabled and AuthRevision; BucketAuthUsers and
	// BucketAuthRoles map a user's or role's name to its authpb.User or
	// authpb.Role.
	BucketAuth      = []byte("auth")
	BucketAuthUsers = []byte("authUsers")
	BucketAuthRoles = []byte("authRoles")
)

// Keys of etcd's "auth" bucket: AuthEnabled is one byte, 1 when auth is on
// (0 or absent: off); AuthRevision the auth revision as 8 big-endian bytes.
var (
	AuthEnabled  = []byte("authEnabled")
	AuthRevision = []byte("authRevision")
)

// Meta keys of etcd's "meta" bucket.
var (
	MetaFinishedCompactRev  = []byte("finishedCompactRev")
	MetaScheduledCompactRev = []byte("scheduledCompactRev")
	MetaConsistentIndex     = []byte("consistent_index")
	MetaTerm                = []byte("term")
	MetaStorageVersion      = []byte("storageVersion")
)

// StorageVersion is the storage version written by etcd 3.6, and the one
// Engram's snapshots declare.
const StorageVersion = "3.6.0"

// RevBytesLen is the length of a bucket key without the tombstone mark.
const RevBytesLen = 17

// ErrMalformed reports a bucket key or value that is not in etcd's format.
var ErrMalformed = errors.New("etcdfmt: malformed record")

// Revision is etcd's revision of one change: the transaction's main
// revision and the change's index within it.
type Revision struct {
	Main int64
	Sub  int64
}

// Less orders revisions as etcd's bucket does.
func (r Revision) Less(o Revision) bool {
	return r.Main < o.Main || r.Main == o.Main && r.Sub < o.Sub
}

// AppendBucketKey appends r's bucket key, with the tombstone mark if set.
func AppendBucketKey(dst []byte, r Revision, tombstone bool) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(r.Main))
	dst = append(dst, '_')
	dst = binary.BigEndian.AppendUint64(dst, uint64(r.Sub))
	if tombstone {
		dst = append(dst, 't')
	}
	return dst
}

// ParseBucketKey decodes a bucket key.
func ParseBucketKey(k []byte) (Revision, bool, error) {
	if len(k) != RevBytesLen && !(len(k) == RevBytesLen+1 && k[RevBytesLen] == 't') || k[8] != '_' {
		return Revision{}, false, fmt.Errorf("%w: bucket key %x", ErrMalformed, k)
	}
	r := Revision{Main: int64(binary.BigEndian.Uint64(k)), Sub: int64(binary.BigEndian.Uint64(k[9:]))}
	if r.Main < 0 || r.Sub < 0 {
		return Revision{}, false, fmt.Errorf("%w: negative revision in bucket key %x", ErrMalformed, k)
	}
	return r, len(k) == RevBytesLen+1, nil
}

// EncodeRevision writes r in the 17-byte form etcd keeps its compacted
// revisions in (meta finishedCompactRev / scheduledCompactRev).
func EncodeRevision(r Revision) []byte { return AppendBucketKey(nil, r, false) }

// Entry is one row of etcd's key bucket: one version of one key.
type Entry struct {
	Rev       Revision
	Tombstone bool
	// KV is the version. For a tombstone only Key is meaningful; ModRevision
	// is Rev.Main for convenience but is not written.
	KV KeyValue
	// Latest is export metadata, not part of etcd's format: the row is its
	// key's latest version in the export. A latest row that is not a
	// tombstone is in etcd's HashKV "keep" set (see Hashed).
	Latest bool
}

// BucketKey returns e's bucket key.
func (e *Entry) BucketKey() []byte {
	return AppendBucketKey(make([]byte, 0, RevBytesLen+1), e.Rev, e.Tombstone)
}

// BucketValue returns e's bucket value: the marshalled KeyValue, or for a
// tombstone a KeyValue holding only the key (as etcd writes it).
func (e *Entry) BucketValue() []byte {
	return e.AppendBucketValue(make([]byte, 0, e.KV.MarshalBound()))
}

// AppendBucketValue appends e's bucket value to dst.
func (e *Entry) AppendBucketValue(dst []byte) []byte {
	if e.Tombstone {
		return (&KeyValue{Key: e.KV.Key}).AppendMarshal(dst)
	}
	return e.KV.AppendMarshal(dst)
}

// DecodeEntry decodes one key-bucket row. A tombstone's KV gets
// ModRevision = Rev.Main.
func DecodeEntry(k, v []byte) (Entry, error) { return decodeEntry(k, v, false) }

// DecodeEntryView is DecodeEntry whose entry's byte slices alias v.
func DecodeEntryView(k, v []byte) (Entry, error) { return decodeEntry(k, v, true) }

func decodeEntry(k, v []byte, view bool) (Entry, error) {
	r, tomb, err := ParseBucketKey(k)
	if err != nil {
		return Entry{}, err
	}
	e := Entry{Rev: r, Tombstone: tomb}
	if err := e.KV.unmarshal(v, view); err != nil {
		return Entry{}, fmt.Errorf("%w: value at revision %d/%d: %v", ErrMalformed, r.Main, r.Sub, err)
	}
	if len(e.KV.Key) == 0 {
		return Entry{}, fmt.Errorf("%w: value at revision %d/%d has no key", ErrMalformed, r.Main, r.Sub)
	}
	if tomb {
		e.KV = KeyValue{Key: e.KV.Key, ModRevision: r.Main}
	} else if e.KV.ModRevision != r.Main {
		return Entry{}, fmt.Errorf("%w: value at revision %d/%d says mod_revision %d", ErrMalformed, r.Main, r.Sub, e.KV.ModRevision)
	}
	return e, nil
}

// Lease is one row of etcd's lease bucket (leasepb.Lease). Which keys are
// attached is not stored here: it follows from each key's latest version.
type Lease struct {
	ID           int64
	TTL          int64
	RemainingTTL int64
}

// LeaseKey returns the lease bucket key of id.
func LeaseKey(id int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(id)) }

// EncodeLease marshals l as etcd's leasepb.Lease (fields 1-3, varints,
// zero values omitted, as gogo's generated code writes them).
func EncodeLease(l Lease) []byte {
	var b []byte
	for i, v := range [...]int64{l.ID, l.TTL, l.RemainingTTL} {
		if v != 0 {
			b = protowire.AppendTag(b, protowire.Number(i+1), protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(v))
		}
	}
	return b
}

// DecodeLease unmarshals a lease bucket value, skipping unknown fields as
// protobuf does.
func DecodeLease(b []byte) (Lease, error) {
	var l Lease
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return Lease{}, fmt.Errorf("%w: lease: %v", ErrMalformed, protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.VarintType {
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return Lease{}, fmt.Errorf("%w: lease: %v", ErrMalformed, protowire.ParseError(m))
			}
			b = b[m:]
			continue
		}
		v, m := protowire.ConsumeVarint(b)
		if m < 0 {
			return Lease{}, fmt.Errorf("%w: lease: %v", ErrMalformed, protowire.ParseError(m))
		}
		b = b[m:]
		setVarintField([]*int64{1: &l.ID, 2: &l.TTL, 3: &l.RemainingTTL}, num, v)
	}
	return l, nil
}

// setVarintField stores v in the field of number num, fields[num], if the
// message has one (a nil entry or a number past the end: it does not).
func setVarintField(fields []*int64, num protowire.Number, v uint64) {
	if num >= 0 && int(num) < len(fields) && fields[num] != nil {
		*fields[num] = int64(v)
	}
}

// Hasher computes etcd's HashKV: a crc32 (Castagnoli) over the key bucket's
// name and then every hashed row's bucket key and value, in revision order.
// Which rows are hashed is Hashed's rule; the caller feeds rows in order.
type Hasher struct {
	h   hash.Hash32
	buf []byte
}

// NewHasher starts a HashKV computation.
func NewHasher() *Hasher {
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	_, _ = h.Write(BucketKey)
	return &Hasher{h: h}
}

// Add hashes one row.
func (h *Hasher) Add(e *Entry) {
	h.buf = AppendBucketKey(h.buf[:0], e.Rev, e.Tombstone)
	_, _ = h.h.Write(h.buf)
	_, _ = h.h.Write(e.BucketValue())
}

// Sum returns the hash.
func (h *Hasher) Sum() uint32 { return h.h.Sum32() }

// Hashed is etcd's rule (server/storage/mvcc/hash.go) for whether a
// key-bucket row takes part in HashKV at revision rev after compaction at
// compactRev (-1 or 0 when never compacted):
//
//   - rows above rev are not hashed;
//   - a row at or below compactRev is hashed only if it is in keep, the set
//     of each key's latest version at or below rev while that version is not
//     a tombstone; but when keep is empty (no key is live at rev) no row is
//     skipped for this reason;
//   - a tombstone at exactly compactRev is never hashed (etcd releases
//     disagree on whether compaction removes it).
//
// inKeep says whether the row is in keep; keepEmpty whether keep is empty.
func Hashed(e *Entry, compactRev, rev int64, inKeep, keepEmpty bool) bool {
	if e.Rev.Main > rev {
		return false
	}
	if e.Rev.Main <= compactRev && !keepEmpty && !inKeep {
		return false
	}
	return !(e.Tombstone && e.Rev.Main == compactRev)
}
