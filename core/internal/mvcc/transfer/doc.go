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
// # Status
//
// This is the draft of the interface, committed before the move. The
// wing's files are still in package mvcc (export.go, hashkv.go, import.go,
// importrows.go, importrecord.go, importbulk.go, importlayout.go, with
// transfer_test.go, export_superseded_test.go and importbulk_test.go);
// nothing here is used yet.
//
// # What the wing uses of mvcc today
//
// Measured on the files above: the version header (header, appendHeader,
// encodeObject, decodeHeader, subUnknown); the change-log record (change,
// appendChanges, encodeChanges, changeCount, decodeChanges); the lease
// record (encodeLease); the meta records (metaCompact with compactRecord,
// metaImport); the Backend for export and HashKV (closed, pinCompacted,
// readRevisions, storedLeases, tempDir, compacted for etcd's -1 compact
// revision, and its kv.Store for Gets and Scans); and two helpers
// (storageErr, scanAll). Key layout comes from package coder directly
// (revision, object, event, lease and lease-index keys, spaces, meta keys),
// which stays so: coder already owns it alone.
//
// # The narrow API mvcc offers (draft)
//
// Records, in mvcc/layout.go, wrapping today's unexported code without
// changing a byte:
//
//	// Version is one version of a key as its record holds it.
//	type Version struct {
//		ModRev, Sub, CreateRev, Version, Lease int64
//		Tombstone bool
//	}
//	const SubUnknown = -1 // a record written before sub revisions were kept
//	func AppendVersion(dst []byte, v Version, value []byte) []byte
//	func DecodeVersion(rec []byte) (v Version, value []byte, err error)
//
//	// Change is one key's change in a revision's change-log record.
//	type Change struct {
//		Deleted    bool
//		Key        []byte
//		PrevRev    int64
//		Superseded []byte // version record of a put superseded in its revision
//	}
//	func AppendChanges(dst []byte, cs []Change) []byte
//	func DecodeChanges(rec []byte) ([]Change, error)
//	func ChangeCount(rec []byte) (int, error) // without decoding
//
//	func LeaseRecord(ttl int64) []byte
//	func CompactRecord(compacted, physical int64) kv.Pair // meta "compact"
//
// The import record stays in mvcc, since Open must refuse a half-imported
// store; transfer writes and clears it through:
//
//	type ImportRecord struct{ ... }                      // unchanged
//	func ReadImportRecord(ctx, kv.Store) (*ImportRecord, error)
//	func ImportRecordOp(rec ImportRecord) (kv.Op, error) // put meta "import"
//	func ClearImportRecordOp() kv.Op                     // delete it
//	var ErrImportUnfinished                              // Open's refusal
//
// Reads of a served store, for export and HashKV:
//
//	// PinHistory pins the compacted revision for a read of all history
//	// that compaction keeps (today's pinCompacted).
//	func (b *Backend) PinHistory(ctx) (cur, compact int64, unpin func(), err error)
//	// Records is the engine, for Gets and Scans of the pinned history only.
//	func (b *Backend) Records() kv.Reader // Get and Scan of kv.Store
//	func (b *Backend) StoredLeases(ctx) ([]etcdfmt.Lease, error)
//	func (b *Backend) Revisions(ctx) (cur, compact int64, err error)
//	func (b *Backend) EtcdCompactRev(compact int64) int64 // -1: never compacted
//	func (b *Backend) TempDir() string                    // exists
//
// plus the errors ErrClosed, ErrFutureRev and ErrCompacted, exported
// already. kv.Reader (Get and Scan) would be new in package kv, so that an
// export cannot commit.
//
// # What moves here
//
//	export.go       Export(ctx, *mvcc.Backend, rev, fn) (ExportInfo, error)
//	hashkv.go       HashKV(ctx, *mvcc.Backend, rev) (KVHash, error)
//	import.go       NewImporter, CheckEmpty, Finish, ErrNotEmpty
//	importrows.go   Importer.Add, Lease, DropLease, Advance, Flush
//	importrecord.go Unfinish and the importer's record writes
//	importbulk.go   BulkImport
//	importlayout.go a key's records derived from its versions
//
// Callers to update: core/backup (Export, BulkImport, ImportLease),
// core/migrate (NewImporter, ImportOptions, FinishOptions, CheckEmpty,
// Unfinish, ErrNotEmpty, Importer, and HashKV in verify.go),
// core/internal/etcdapi (Hash and HashKV; its Snapshot goes through
// core/backup), and their
// tests; ReadImportRecord, ImportRecord and ErrImportUnfinished stay mvcc's.
package transfer
