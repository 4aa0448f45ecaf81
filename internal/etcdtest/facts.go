package etcdtest

import (
	"encoding/json"
	"fmt"
	"os"
)

// SnapshotFacts is what a real etcd said about its keyspace right before
// `etcdctl snapshot save` wrote a snapshot file: the JSON facts file next
// to each snapshot in core/snapshot/testdata (written by
// TestGenerateSnapshots in this package's tests). Tests reading the
// snapshot compare what they rebuild from it with these facts. []byte
// fields are base64 in JSON, as encoding/json writes them.
type SnapshotFacts struct {
	// Snapshot is the snapshot file's name, relative to the facts file.
	Snapshot string `json:"snapshot"`
	// SnapshotSize and SnapshotSHA256 identify the snapshot file the facts
	// belong to (its whole content, sha256 trailer included, hex).
	SnapshotSize   int64  `json:"snapshot_size"`
	SnapshotSHA256 string `json:"snapshot_sha256"`
	// EtcdVersion is the server version etcd's Status reported.
	EtcdVersion string `json:"etcd_version"`
	// Revision is the current revision when the snapshot was taken.
	Revision int64 `json:"revision"`
	// CompactRevision is HashKV's compact_revision at Revision: the last
	// compaction's revision, -1 when etcd was never compacted.
	CompactRevision int64 `json:"compact_revision"`
	// FirstRevision is max(CompactRevision, 1), the first revision Hashes
	// and Ranges cover (the compact revision itself can still be read).
	FirstRevision int64 `json:"first_revision"`
	// Hashes holds HashKV at every revision from FirstRevision to Revision,
	// as the live etcd answered. See RestoredCompactHash for the first.
	Hashes []HashKVFact `json:"hashes"`
	// RestoredCompactHash is HashKV at CompactRevision as an etcd started
	// on the restored snapshot answers it; nil when never compacted. It
	// differs from the live etcd's Hashes[0]: while compacting, etcd
	// stores the hash of the history up to the compact revision, taken
	// before the compaction (with the previous compaction's revision, -1
	// here, as compact_revision), and answers HashKV at exactly that
	// revision from it (mvcc/hash.go HashByRev, kvstore.go compact). That
	// store is in memory only, so a restarted or restored etcd hashes what
	// the compaction left instead, with compact_revision = CompactRevision.
	// A store rebuilt from the snapshot can only match this one.
	RestoredCompactHash *HashKVFact `json:"restored_compact_hash,omitempty"`
	// Ranges holds the whole keyspace (key "\x00", range_end "\x00") read
	// at every revision from FirstRevision to Revision.
	Ranges []RangeFact `json:"ranges"`
	// WatchFrom is the revision the watch behind Events started at:
	// CompactRevision+1, or 1 when never compacted.
	WatchFrom int64 `json:"watch_from"`
	// Events are the watch events (with prev_kv requested) of the whole
	// keyspace from WatchFrom to Revision, in the order etcd sent them:
	// by revision, and within a revision in the order of its operations.
	Events []EventFact `json:"events"`
	// Leases are the leases alive at Revision, by ID.
	Leases []LeaseFact `json:"leases"`
	// Status is `etcdutl snapshot status <file> -w json` of the snapshot.
	Status SnapshotStatus `json:"status"`
	// Workload lists the writes that made the keyspace, with the revision
	// each produced (0 for operations that write no revision, such as a
	// lease grant), so tests can name the interesting revisions.
	Workload []WorkloadOp `json:"workload"`
}

// HashKVFact is one HashKV response.
type HashKVFact struct {
	// Revision is the revision asked for.
	Revision        int64  `json:"revision"`
	Hash            uint32 `json:"hash"`
	CompactRevision int64  `json:"compact_revision"`
	HashRevision    int64  `json:"hash_revision"`
	// HeaderRevision is the response header's revision (the current one).
	HeaderRevision int64 `json:"header_revision"`
}

// RangeFact is the keyspace as a Range at Revision returned it.
type RangeFact struct {
	Revision int64      `json:"revision"`
	KVs      []KeyValue `json:"kvs"`
}

// KeyValue mirrors mvccpb.KeyValue.
type KeyValue struct {
	Key            []byte `json:"key"`
	Value          []byte `json:"value"`
	CreateRevision int64  `json:"create_revision"`
	ModRevision    int64  `json:"mod_revision"`
	Version        int64  `json:"version"`
	Lease          int64  `json:"lease"`
}

// EventFact mirrors mvccpb.Event.
type EventFact struct {
	// Type is "PUT" or "DELETE".
	Type   string    `json:"type"`
	KV     KeyValue  `json:"kv"`
	PrevKV *KeyValue `json:"prev_kv,omitempty"`
}

// LeaseFact is one lease as LeaseTimeToLive (with keys) reported it.
type LeaseFact struct {
	ID         int64    `json:"id"`
	GrantedTTL int64    `json:"granted_ttl"`
	Keys       [][]byte `json:"keys"`
}

// SnapshotStatus is etcdutl's JSON of `snapshot status`: Hash is a crc32
// of the bbolt buckets' contents, TotalSize the bbolt file's size without
// the trailer, Version the storage version.
type SnapshotStatus struct {
	Hash      uint32 `json:"hash"`
	Revision  int64  `json:"revision"`
	TotalKey  int    `json:"totalKey"`
	TotalSize int64  `json:"totalSize"`
	Version   string `json:"version"`
}

// WorkloadOp is one step of the workload behind a snapshot.
type WorkloadOp struct {
	Revision int64  `json:"revision"`
	Op       string `json:"op"`
}

// LoadFacts reads a facts file.
func LoadFacts(path string) (*SnapshotFacts, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: %w", err)
	}
	var f SnapshotFacts
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("etcdtest: %s: %w", path, err)
	}
	return &f, nil
}

// RangeAt returns the keyspace recorded at revision rev, false when rev is
// outside FirstRevision..Revision.
func (f *SnapshotFacts) RangeAt(rev int64) ([]KeyValue, bool) {
	for _, r := range f.Ranges {
		if r.Revision == rev {
			return r.KVs, true
		}
	}
	return nil, false
}

// HashAt returns HashKV recorded at revision rev, false when rev is
// outside FirstRevision..Revision. At CompactRevision it is the live
// etcd's answer; see RestoredCompactHash.
func (f *SnapshotFacts) HashAt(rev int64) (HashKVFact, bool) {
	for _, h := range f.Hashes {
		if h.Revision == rev {
			return h, true
		}
	}
	return HashKVFact{}, false
}
