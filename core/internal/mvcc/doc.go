// Package mvcc is Engram's multi-version store: etcd's data model (revisions,
// create/mod revisions, versions, leases, reads at any uncompacted revision,
// transactions, compaction) built on the small kv.Store contract.
//
// It owns the single serial writer that allocates revisions, evaluates every
// write against the latest state, and commits many writes in one atomic batch
// (group commit: one fsync for all of them). The records a write needs are
// read ahead by the request's own goroutine (prefetch), so the writer does no
// engine I/O in the common case, and the writer evaluates the next group
// while the committer commits the last one (a pipeline). It must not speak
// gRPC or know about watchers beyond handing committed events to a Notifier.
//
// # Data layout (see package coder for the key format)
//
//	revision key(k)   -> k's latest version: header + value (a tombstone after a delete)
//	object key(k, r)  -> header + value of k's version at revision r, for every
//	                     version that a later revision superseded (history)
//	event key(r)      -> the keys changed at revision r, in order, each with the
//	                     revision of its live version before r
//	lease key(id)     -> granted TTL
//	lease index(id,k) -> present while k is attached to lease id
//	meta "compact"    -> compacted and physically compacted revisions
//	meta "import"     -> present while an import is half done (importrecord.go)
//
// A write moves the key's current version from its revision key into history
// and puts the new one in the revision key, in one batch. So a read at the
// current revision (nearly every read) scans revision keys only and needs no
// second lookup for values, a point read is one Get, and no value is stored
// twice. A read at an older revision falls back to history for keys changed
// since. On the writing node, recently used revision-key records are also
// cached in memory (latest.go), so point reads and the writer's checks of
// compares and CASes usually need no engine lookup.
//
// # Worked example
//
// One key, k, through a create, an update, a delete, a re-create and a
// compaction, on an empty store (whose revision is 1). Each table is
// everything the engine holds after the step, in the engine's key order
// (change log 'e', revision keys 'k', meta 'm', history 'o'), one
// "key -> value" pair a line, in package coder's notation: magic('x') is the
// 4-byte magic whose last byte names space 'x', quoted text is bytes as they
// are, every other byte is in hex. In a revision or object key,
// escape(k) is "k" (k has no 0x00 byte to escape), then come the terminator
// 00 01 and the big-endian revision (0 in the revision key). An event key is
// the big-endian revision alone.
//
// A version record (revision and object keys; appendHeader in record.go) is
// the format byte 02, the flags byte (01: tombstone), the uvarints mod
// revision, create revision, version, lease and sub revision, then the
// value. A change-log record (encodeChanges) is the format byte 01, the
// number of changes, and for each change 01 if it deleted the key (else 00),
// the key's length and bytes, and the revision of the key's live version
// before this revision (00: none, or a put that created the key); a put
// that a later change of the same revision superseded (one transaction may
// change a key twice) is marked 02 instead and followed by its version
// record's length and bytes, since history keeps only a revision's last
// version. Meta "compact" holds the compacted and the physically compacted
// revision, big-endian. TestWorkedExample performs these steps and
// fails unless the engine holds exactly these tables.
//
// Create k = "v1" (revision 2): the revision key holds version 1 (mod and
// create revision 2); the change log records a change with no previous
// version.
//
//	magic('e') 00 00 00 00 00 00 00 02             -> 01 01 00 01 "k" 00
//	magic('k') "k" 00 01 00 00 00 00 00 00 00 00   -> 02 00 02 02 01 00 00 "v1"
//
// Update k = "v2" (revision 3): version 1 moves to history under its own
// revision; the revision key holds version 2 (mod 3, create 2); the change
// names 2 as the previous version.
//
//	magic('e') 00 00 00 00 00 00 00 02             -> 01 01 00 01 "k" 00
//	magic('e') 00 00 00 00 00 00 00 03             -> 01 01 00 01 "k" 02
//	magic('k') "k" 00 01 00 00 00 00 00 00 00 00   -> 02 00 03 02 02 00 00 "v2"
//	magic('o') "k" 00 01 00 00 00 00 00 00 00 02   -> 02 00 02 02 01 00 00 "v1"
//
// Delete k (revision 4): version 2 moves to history; the revision key holds
// a tombstone (flags 01, mod 4, create revision, version and lease 0); the
// change is a delete whose previous version is 3.
//
//	magic('e') 00 00 00 00 00 00 00 02             -> 01 01 00 01 "k" 00
//	magic('e') 00 00 00 00 00 00 00 03             -> 01 01 00 01 "k" 02
//	magic('e') 00 00 00 00 00 00 00 04             -> 01 01 01 01 "k" 03
//	magic('k') "k" 00 01 00 00 00 00 00 00 00 00   -> 02 01 04 00 00 00 00
//	magic('o') "k" 00 01 00 00 00 00 00 00 00 02   -> 02 00 02 02 01 00 00 "v1"
//	magic('o') "k" 00 01 00 00 00 00 00 00 00 03   -> 02 00 03 02 02 00 00 "v2"
//
// Re-create k = "v3" (revision 5): the tombstone moves to history too (a
// read at revision 4 must find k deleted); the new version starts again at
// version 1 with create revision 5, and its change has no previous version,
// since k was not live.
//
//	magic('e') 00 00 00 00 00 00 00 02             -> 01 01 00 01 "k" 00
//	magic('e') 00 00 00 00 00 00 00 03             -> 01 01 00 01 "k" 02
//	magic('e') 00 00 00 00 00 00 00 04             -> 01 01 01 01 "k" 03
//	magic('e') 00 00 00 00 00 00 00 05             -> 01 01 00 01 "k" 00
//	magic('k') "k" 00 01 00 00 00 00 00 00 00 00   -> 02 00 05 05 01 00 00 "v3"
//	magic('o') "k" 00 01 00 00 00 00 00 00 00 02   -> 02 00 02 02 01 00 00 "v1"
//	magic('o') "k" 00 01 00 00 00 00 00 00 00 03   -> 02 00 03 02 02 00 00 "v2"
//	magic('o') "k" 00 01 00 00 00 00 00 00 00 04   -> 02 01 04 00 00 00 00
//
// Compact at revision 4 (compact.go): a read at 4 or later needs nothing of
// k's history at or below 4, because the newest version there, the
// tombstone at 4, says k was deleted; so all three history versions go. The
// change-log records below 4 go too; the one at 4 stays, since a watch may
// start at the compacted revision. Meta "compact" records 4 as both the
// compacted and the physically compacted revision. Had the latest version
// been at or below 4 and a tombstone, the revision key would have gone as
// well.
//
//	magic('e') 00 00 00 00 00 00 00 04             -> 01 01 01 01 "k" 03
//	magic('e') 00 00 00 00 00 00 00 05             -> 01 01 00 01 "k" 00
//	magic('k') "k" 00 01 00 00 00 00 00 00 00 00   -> 02 00 05 05 01 00 00 "v3"
//	magic('m') "compact"                           -> 00 00 00 00 00 00 00 04 00 00 00 00 00 00 00 04
//
// # Invariants
//
// Each invariant names the code that keeps it.
//
//   - Revisions are dense: a write transaction that changes anything takes
//     exactly clock+1; one that changes nothing takes none. (group.txn in
//     txn.go and group.leaseRevoke in lease.go take a revision only when
//     they staged a change; one writer, writeloop.go, allocates them all.)
//   - A write is acknowledged only after the batch holding it committed; the
//     clock is advanced (making the revision readable) before acknowledgement,
//     so every linearizable read that starts after an ack sees the write.
//     (commitGroup in groupcommit.go advances the clock last; commitLoop in
//     pipeline.go answers a group only after commitGroup returned.)
//   - Groups reach the engine one at a time, in the order they were
//     evaluated, each only after the group it was built on committed; a
//     group built on one that failed is never committed, and its requests
//     are evaluated again on the committed state, unanswered until then. So
//     nothing is acknowledged, published or sent to watchers on the strength
//     of a write that did not happen. (pipeline.go; writer.reset in
//     writer.go.)
//   - The writer evaluates on the newest state: its group's own writes, then
//     the states left by groups still in the pipeline (writer.pending), then
//     a record the request read ahead, used only if no group numbered after
//     the read's committed sequence wrote the key (writeSeqs), else the
//     latest-record cache or the engine. (group.state in group.go; the rule
//     and why it is safe are stated in prefetch.go.) A create whose key the
//     cache does not know presumes it absent instead of reading it; the
//     batch's put-if-absent checks that at commit, and a group refused on
//     such a key is evaluated again, unanswered, with the key read.
//     (presume.go; commitLoop in pipeline.go.)
//   - Every write transaction updates the revision key of each key it touches
//     with a compare-and-swap against the value the writer read, and the
//     change-log record of a group's first revision is created with
//     put-if-absent, so a second writer on the same store (a deposed leader)
//     can never interleave silently: its batch fails whole. (group.batch and
//     group.appendLog in group.go; commitGroup maps the conflict to
//     ErrStoreConflict or ErrNotLeader, except one on a key the group
//     presumed absent.)
//   - The revision key, the object key, the change-log record and lease index
//     changes of a write are in one batch: a crash leaves all or none.
//     (group.batch in group.go, committed once by commitGroup in
//     groupcommit.go; an uncertain commit is resolved before anything later
//     commits: resolveUncertain, same file.)
//   - Reads never go back in revision, on any node (linearizability): once
//     a read has observed revision N, every operation that starts later, on
//     this node or another, observes at least N and every write at or below
//     it. A leader publishes a revision only after the engine acknowledged
//     it, and in a cluster a leader read also waits for a commit in flight
//     (followers read the store, which may show that commit first) and is
//     refused once the leader's lease ran out, or once a commit's outcome
//     went unresolved (the leader stopped before reading it back); a
//     follower read takes the revision from a store read that started
//     after the read did.
//     (readRevisions in backend.go, inflightCommit in groupcommit.go,
//     readbarrier.go; tests/linearizability checks recorded histories of
//     both with porcupine.)
//   - For every key, the versions above the compacted revision and the
//     latest one at or below it stay readable (in history or the revision
//     key), so reads at any uncompacted revision and prev_kv of every event
//     above the compacted revision are answerable. (compactPhysical in
//     compact.go decides what goes; pin in backend.go keeps history that a
//     running read still needs.)
//
// # Files
//
//	backend.go       Open, Close, the revisions a read observes, read pins
//	writeloop.go     write requests, the single writer's loop, grouping
//	writer.go        the writer's own state: revision, pending keys, resets
//	prefetch.go      records read ahead of the writer, and when they are valid
//	presume.go       a create's key presumed absent instead of read
//	pipeline.go      the queue between writer and committer; the committer
//	txn.go           transaction evaluation: compares, checks, put/delete/range
//	txnrange.go      a Range inside a write transaction
//	group.go         a write group's key states, staged versions, its batch
//	groupcommit.go   committing a group and publishing it; uncertain commits
//	meta.go          writes to the store's own records through the writer
//	lease.go         lease grants and revokes, leases at Open
//	record.go        the encoding of version, change-log and lease records
//	latest.go        the latest-record cache
//	read.go          Range: reads at a revision
//	rangestream.go   etcd 3.7's RangeStream: a Range answered in pages
//	countcache.go    counts of paginated lists
//	events.go        the change log read back as watch events
//	compact.go       logical and physical compaction
//	metrics.go       the writer's, compaction's and the cache's metrics
//	readbarrier.go   a follower's read revision
//	importrecord.go  the record that keeps a half-done import from being served
//	layout.go        the narrow API of package transfer: records, pinned history
//
// Moving whole histories in and out (export, HashKV, restore, migration)
// is package transfer's, which reaches the records only through layout.go.
//
// The reasons behind the layout, the writer and compaction, and the
// measurements behind them, are in DESIGN.md ("The write path", "The read
// path", "Group commit", "Pipelined group commit", "Prefetched records",
// "Presumed absence", "The latest-record cache", "Reads at a revision",
// "Compaction's rule", "Uncertain commits", "The read barrier", "Bulk
// restore").
package mvcc
