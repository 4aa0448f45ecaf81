package mvcc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// The narrow API package transfer (which moves whole histories in and out)
// uses instead of mvcc's internals. Every function here delegates to the
// one encoder or decoder the writer and readers use (record.go), so the
// record layout keeps a single owner: transfer never writes a record byte
// of its own. Package transfer's doc lists it.

// SubUnknown is the Sub of a version record written before sub revisions
// were kept.
const SubUnknown = subUnknown

// AppendVersion appends the version record of v with value to dst.
func AppendVersion(dst []byte, v Version, value []byte) []byte {
	return append(appendHeader(dst, v), value...)
}

// DecodeVersion decodes a version record; value aliases rec.
func DecodeVersion(rec []byte) (v Version, value []byte, err error) {
	return decodeHeader(rec)
}

// AppendChanges appends the change-log record of cs to dst.
func AppendChanges(dst []byte, cs []Change) []byte { return appendChanges(dst, cs) }

// DecodeChanges decodes a change-log record; keys and superseded records
// alias rec.
func DecodeChanges(rec []byte) ([]Change, error) { return decodeChanges(rec) }

// ChangeCount returns the number of changes a change-log record holds
// without decoding them (most revisions change one key).
func ChangeCount(rec []byte) (int, error) {
	n, _, err := changeCount(rec)
	return n, err
}

// LeaseRecord is the record of a lease granted with ttl.
func LeaseRecord(ttl int64) []byte { return encodeLease(ttl) }

// CompactRecord is meta "compact" recording the compacted and physically
// compacted revisions.
func CompactRecord(compacted, physical int64) kv.Pair {
	return kv.Pair{Key: coder.MetaKey(metaCompact), Value: compactRecord(compacted, physical)}
}

// ImportRecordOp writes rec as the store's import record, which makes Open
// refuse the store until ClearImportRecordOp is committed.
func ImportRecordOp(rec ImportRecord) (kv.Op, error) {
	raw, err := json.Marshal(rec)
	if err != nil {
		return kv.Op{}, fmt.Errorf("mvcc: encode import record: %w", err)
	}
	return kv.Put(coder.MetaKey(metaImport), raw), nil
}

// ClearImportRecordOp removes the import record: committed in the batch
// that completes an import, it makes the store servable.
func ClearImportRecordOp() kv.Op { return kv.Delete(coder.MetaKey(metaImport)) }

// RecordReader is the part of kv.Store an export needs: it can read the
// records, never commit.
type RecordReader interface {
	Get(ctx context.Context, key []byte) ([]byte, error)
	Scan(ctx context.Context, opts kv.ScanOptions) (kv.Iterator, error)
}

// Records gives an export read access to the engine. Read only what
// PinHistory keeps: history below the pin may be compacted away.
func (b *Backend) Records() RecordReader { return b.store }

// PinHistory pins the compacted revision for a read of all history that
// compaction keeps, and returns the current and compacted revisions. Call
// unpin when the read is done.
func (b *Backend) PinHistory(ctx context.Context) (cur, compact int64, unpin func(), err error) {
	if b.closed.Load() {
		return 0, 0, nil, ErrClosed
	}
	return b.pinCompacted(ctx)
}

// Revisions returns the revision a read observes and the compacted
// revision, as every read takes them (linearizable on a leader and a
// follower alike).
func (b *Backend) Revisions(ctx context.Context) (cur, compact int64, err error) {
	return b.readRevisions(ctx)
}

// StoredLeases returns the leases the store holds.
func (b *Backend) StoredLeases(ctx context.Context) ([]etcdfmt.Lease, error) {
	return b.storedLeases(ctx)
}

// EtcdCompactRev is compact as etcd reports it: -1 for a store never
// compacted, which clients tell from one compacted at 0.
func (b *Backend) EtcdCompactRev(compact int64) int64 { return b.etcdCompactRev(compact) }

// EncodeVersion is AppendVersion into a buffer of the right size.
func EncodeVersion(v Version, value []byte) []byte { return encodeObject(v, value) }

// EncodeChanges is AppendChanges into a buffer of the right size.
func EncodeChanges(cs []Change) []byte { return encodeChanges(cs) }

// ImportRecordKey is the key of the import record, which an import must
// not overwrite with meta records of its own, and a wipe removes last.
func ImportRecordKey() []byte { return coder.MetaKey(metaImport) }

// StorageError wraps an engine error of operation op as mvcc's reads and
// writes do: ErrClosed for a closed engine, ErrUnavailable otherwise, and a
// context's error as it is.
func StorageError(op string, err error) error { return storageErr(op, err) }

// etcdCompactRev is the compacted revision as etcd reports it: -1 for a
// store never compacted, 0 for one compacted at 0.
func (b *Backend) etcdCompactRev(rev int64) int64 {
	if rev == 0 && !b.compacted.Load() {
		return -1
	}
	return rev
}

// pinCompacted pins the compacted revision for a read of all history that
// compaction keeps, retrying if a compaction moves it meanwhile.
func (b *Backend) pinCompacted(ctx context.Context) (cur, compact int64, unpin func(), err error) {
	for {
		cur, compact, err = b.Revisions(ctx)
		if err != nil {
			return 0, 0, nil, err
		}
		unpin, err = b.pin(compact)
		if errors.Is(err, ErrCompacted) {
			continue
		}
		return cur, compact, unpin, err
	}
}
