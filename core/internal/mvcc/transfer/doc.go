// Package transfer moves whole histories into and out of an mvcc store:
// the store read as an etcd key bucket (snapshots, backups, a migration's
// verification), etcd's HashKV computed over it, the row importer a
// migration feeds, and the bulk restore that loads a whole history in one
// kv.Load. It is mvcc's import/export wing, split off because it is a
// second concern: mvcc serves reads and writes one revision at a time,
// transfer moves every revision at once.
//
// It must not own or re-implement a record format. Package mvcc is the only
// owner of the version, change-log, lease and meta records (record.go and
// the worked example in mvcc's package doc), and package coder the only
// owner of the key layout. Transfer reaches records only through the narrow
// API below, so a change of format is made, and tested byte for byte, in
// mvcc alone. It must not write to a store that a Backend serves: imports
// run on a store no Backend has open (Open refuses a store whose import
// record is present), and exports only read, under mvcc's pin of the
// compacted revision.
//
// # The narrow API mvcc offers (mvcc/layout.go)
//
// Records, each a delegation to the one encoder or decoder the writer and
// readers use, so not a byte of format is written twice. Version and
// Change are the very types mvcc's writer and readers use (exported, not
// copied, so no conversion costs the bulk restore an allocation a
// revision):
//
//	type Version struct {               // one version, as its record holds it
//		ModRev, Sub, CreateRev, Version, Lease int64
//		Tombstone                      bool
//	}
//	const SubUnknown                    // Sub of a record from before sub revisions
//	func AppendVersion(dst []byte, v Version, value []byte) []byte
//	func DecodeVersion(rec []byte) (v Version, value []byte, err error)
//	type Change struct {                // one key's change in a revision
//		Deleted    bool
//		Key        []byte
//		PrevRev    int64
//		Superseded []byte               // a put superseded in its own revision
//	}
//	func AppendChanges(dst []byte, cs []Change) []byte
//	func DecodeChanges(rec []byte) ([]Change, error)
//	func ChangeCount(rec []byte) (int, error)
//	func EncodeVersion(v Version, value []byte) []byte    // sized buffer
//	func EncodeChanges(cs []Change) []byte                // sized buffer
//	func LeaseRecord(ttl int64) []byte
//	func CompactRecord(compacted, physical int64) kv.Pair // meta "compact"
//
// The import record stays in mvcc, since Open must refuse a half-imported
// store (ImportRecord, ReadImportRecord, ErrImportUnfinished); transfer
// writes and clears it with
//
//	func ImportRecordOp(rec ImportRecord) (kv.Op, error)
//	func ClearImportRecordOp() kv.Op
//	func ImportRecordKey() []byte // not to be overwritten by an import's meta
//
// Reads of a served store, for export and HashKV:
//
//	func (b *Backend) PinHistory(ctx) (cur, compact int64, unpin func(), err error)
//	func (b *Backend) Records() RecordReader // Get and Scan, never Commit
//	func (b *Backend) Revisions(ctx) (cur, compact int64, err error)
//	func (b *Backend) StoredLeases(ctx) ([]etcdfmt.Lease, error)
//	func (b *Backend) EtcdCompactRev(compact int64) int64 // -1: never compacted
//	func (b *Backend) TempDir() string
//
// with the errors ErrClosed, ErrFutureRev and ErrCompacted. Engine errors
// are wrapped as mvcc wraps them (StorageError: ErrClosed, ErrUnavailable);
// a scan is read whole with core/kv's ScanEach.
//
// # Files
//
//	export.go       Export: the store as an etcd key bucket (snapshots)
//	hashkv.go       HashKV: etcd's hash of that bucket
//	import.go       NewImporter, CheckEmpty, Finish: starting and finishing
//	                an import (migration)
//	importrows.go   writing imported rows in revision-aligned batches
//	importrecord.go writing mvcc's import record; Unfinish
//	importbulk.go   BulkImport: a whole history in one kv.Load, key order
//	importlayout.go a key's records derived from its versions (bulk restore)
//
// The reasons behind the bulk restore and its measurements are in
// DESIGN.md ("Bulk restore").
package transfer
