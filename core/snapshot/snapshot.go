// Package snapshot owns etcd's snapshot file: a bbolt database holding an
// etcd backend, optionally followed by a 32-byte sha256 trailer, so that
// Engram can hand backups to etcd's tools (`etcdutl snapshot status`,
// `etcdutl snapshot restore`) and restore the backups etcd makes
// (`etcdctl snapshot save`).
//
// It deals only in etcdfmt's types (key-bucket rows, leases, revisions): it
// must not know Engram's own record layout, which stays in package mvcc, and
// must not speak gRPC; the Snapshot RPC and the command line feed it rows
// and take its files.
//
// The facts it relies on were checked against etcd v3.6
// (etcdutl/snapshot/v3_snapshot.go, server/storage/schema,
// server/storage/mvcc/kvstore.go):
//
//   - etcdutl detects a trailer by the file's size (size % 512 == 32) and
//     without one refuses to restore unless told to skip the hash check;
//   - restore needs the "key" and "meta" buckets ("failed to find a bucket
//     meta" otherwise) and rewrites the members, consistent_index and term;
//   - etcd starts at revision max(1, last key-bucket main revision,
//     finishedCompactRev, scheduledCompactRev).
//
// It is public because `engram snapshot` (cmd/engram) and any other tool that
// checks or converts etcd snapshot files use it directly.
package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"hash/maphash"

	"github.com/engramkv/engram/core/etcdfmt"
)

// Errors Open reports, wrapped with the file's path and details; test them
// with errors.Is.
var (
	ErrNotBolt      = errors.New("not a bbolt database")
	ErrTruncated    = errors.New("truncated bbolt database")
	ErrHashMismatch = errors.New("sha256 trailer does not match the database")
	ErrNoTrailer    = errors.New("no sha256 trailer (size % 512 != 32); skip the hash check to open a database copied from a data directory")
	ErrCorrupt      = errors.New("bbolt integrity check failed")
	ErrNoMetaBucket = errors.New(`failed to find a bucket meta`)
	ErrNoKeyBucket  = errors.New(`failed to find a bucket key`)
)

// trailerLen is the sha256 trailer's length; sizeAlign the alignment that
// tells a trailer apart, as etcdutl does: a bbolt file is a whole number of
// pages, so its size is a multiple of 512, the smallest sector size.
const (
	trailerLen = 32
	sizeAlign  = 512
)

func hasTrailer(size int64) bool { return size%sizeAlign == trailerLen }

// Info describes a snapshot file.
type Info struct {
	// Revision is the revision etcd restores the file at: max(1, last
	// key-bucket main revision, CompactRev, ScheduledCompactRev).
	// `etcdutl snapshot status` prints only the last key-bucket main
	// revision, which is lower when the newest revisions were compacted
	// away (etcd itself starts at this Revision).
	Revision int64
	// CompactRev is meta finishedCompactRev's main revision, 0 if none.
	CompactRev int64
	// ScheduledCompactRev is meta scheduledCompactRev's main revision, 0 if
	// none; above CompactRev, etcd resumes that compaction when it starts.
	ScheduledCompactRev int64
	// TotalKeys is `etcdutl snapshot status`'s "total keys": the keys whose
	// last row is not a tombstone, i.e. the keys live at Revision.
	TotalKeys int
	// Rows is the number of key-bucket rows: versions, tombstones and
	// revision markers.
	Rows int
	// TotalSize is the bbolt database's size (its pages in use, as
	// `etcdutl snapshot status` prints it), without a trailer.
	TotalSize int64
	// Hash is `etcdutl snapshot status`'s hash: a crc32 (Castagnoli) over
	// every bucket's name followed by its keys and values, buckets and
	// keys in bbolt order. It is not HashKV.
	Hash uint32
	// StorageVersion is meta storageVersion as written ("3.6.0"); empty for
	// files of etcd before 3.6.
	StorageVersion string
	// HasHashTrailer says the file ends in a sha256 trailer.
	HasHashTrailer bool
}

// infoBuilder computes Info from a file's buckets fed in bbolt order, the
// same way for a file being read and for one being written.
type infoBuilder struct {
	crc        hash.Hash32
	live       liveKeys
	lastMain   int64
	rows       int
	finished   int64
	scheduled  int64
	storageVer string
}

func newInfoBuilder() *infoBuilder {
	return &infoBuilder{crc: crc32.New(crc32.MakeTable(crc32.Castagnoli)), live: newLiveKeys()}
}

// bucket starts a bucket.
func (b *infoBuilder) bucket(name []byte) { _, _ = b.crc.Write(name) }

// row hashes one row of the current bucket.
func (b *infoBuilder) row(k, v []byte) {
	_, _ = b.crc.Write(k)
	_, _ = b.crc.Write(v)
}

// keyRow accounts for one key-bucket row, fed in revision order.
func (b *infoBuilder) keyRow(e *etcdfmt.Entry) {
	b.lastMain = e.Rev.Main
	b.live.set(e.KV.Key, !e.Tombstone)
}

// metaRow reads the meta keys Info reports.
func (b *infoBuilder) metaRow(k, v []byte) error {
	var dst *int64
	switch {
	case bytes.Equal(k, etcdfmt.MetaFinishedCompactRev):
		dst = &b.finished
	case bytes.Equal(k, etcdfmt.MetaScheduledCompactRev):
		dst = &b.scheduled
	case bytes.Equal(k, etcdfmt.MetaStorageVersion):
		b.storageVer = string(v)
		return nil
	default:
		return nil
	}
	// etcd reads only the main revision of the 17-byte encoding.
	if len(v) < etcdfmt.RevBytesLen {
		return fmt.Errorf("%w: meta %s is %x", etcdfmt.ErrMalformed, k, v)
	}
	*dst = int64(binary.BigEndian.Uint64(v))
	return nil
}

func (b *infoBuilder) info(totalSize int64, trailer bool) Info {
	return Info{
		Revision:            max(1, b.lastMain, b.finished, b.scheduled),
		CompactRev:          b.finished,
		ScheduledCompactRev: b.scheduled,
		TotalKeys:           b.live.len(),
		Rows:                b.rows,
		TotalSize:           totalSize,
		Hash:                b.crc.Sum32(),
		StorageVersion:      b.storageVer,
		HasHashTrailer:      trailer,
	}
}

// liveKeys is the set of keys whose last row is not a tombstone. It holds
// a 128-bit hash of each key rather than the key, so a snapshot of a
// million Kubernetes objects costs tens of MB, not the keys' size; two keys
// colliding is too unlikely to matter for a count.
type liveKeys struct {
	seeds [2]maphash.Seed
	m     map[[2]uint64]struct{}
}

func newLiveKeys() liveKeys {
	return liveKeys{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, m: make(map[[2]uint64]struct{})}
}

func (l liveKeys) set(key []byte, live bool) {
	h := [2]uint64{maphash.Bytes(l.seeds[0], key), maphash.Bytes(l.seeds[1], key)}
	if live {
		l.m[h] = struct{}{}
	} else {
		delete(l.m, h)
	}
}

func (l liveKeys) len() int { return len(l.m) }
