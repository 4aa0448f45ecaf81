// Package mvcc is Engram's multi-version store: etcd's data model (revisions,
// create/mod revisions, versions, leases, reads at any uncompacted revision,
// transactions, compaction) built on the small kv.Store contract.
//
// It owns the single serial writer that allocates revisions, evaluates every
// write against the latest state, and commits many writes in one atomic batch
// (group commit: one fsync for all of them). It must not speak gRPC or know
// about watchers beyond handing committed events to a Notifier.
//
// # Data layout (see package coder for the key format)
//
//	revision key(k)   -> k's latest version: header + value (a tombstone after a delete)
//	object key(k, r)  -> header + value of k's version at revision r, for every
//	                     version that a later one superseded (history)
//	event key(r)      -> the keys changed at revision r, with their previous revisions
//	lease key(id)     -> granted TTL
//	lease index(id,k) -> present while k is attached to lease id
//	meta "compact"    -> compacted and physically compacted revisions
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
// # Invariants
//
//   - Revisions are dense: a write transaction that changes anything takes
//     exactly clock+1; one that changes nothing takes none.
//   - A write is acknowledged only after the batch holding it committed; the
//     clock is advanced (making the revision readable) before acknowledgement,
//     so every linearizable read that starts after an ack sees the write.
//   - Every write transaction updates the revision key of each key it touches
//     with a compare-and-swap against the value the writer read, and creates
//     the change-log record of its revision with put-if-absent, so a second
//     writer on the same store (a deposed leader) can never interleave
//     silently: its batch fails whole.
//   - The revision key, the object key, the change-log record and lease index
//     changes of a write are in one batch: a crash leaves all or none.
//   - Reads never go back in revision, on any node (linearizability): once
//     a read has observed revision N, every operation that starts later, on
//     this node or another, observes at least N and every write at or below
//     it. A leader publishes a revision only after the engine acknowledged
//     it, and in a cluster a leader read also waits for a commit in flight
//     (followers read the store, which may show that commit first) and is
//     refused once the leader's lease ran out; a follower read takes the
//     revision from a store read that started after the read did
//     (readbarrier.go). tests/linearizability checks recorded histories of
//     both with porcupine.
//   - For every key, the versions above the compacted revision and the
//     latest one at or below it stay readable (in history or the revision
//     key), so reads at any uncompacted revision and prev_kv of every event
//     above the compacted revision are answerable.
package mvcc
