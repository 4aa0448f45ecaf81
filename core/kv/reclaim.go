package kv

import "context"

// Reclaimer is implemented by adaptors whose engine can give back, on
// request, the space that deleted keys still take. It is optional. The core
// calls it for etcd's Defragment (`etcdctl defrag`, which operators' cron
// jobs and maintenance scripts run after a compaction); an engine without
// it answers Defragment with success and no work, as does one that manages
// its space entirely by itself.
//
// Reclaim must:
//
//   - do the engine's own reclamation now, as far as it goes (flushing
//     buffered deletes, compacting tables so that tombstones and the versions
//     they hide are dropped, collecting garbage in value logs), and return
//     once it is done, nil when there was nothing to do;
//   - keep every live key readable and every committed write durable: it
//     changes where data sits, never what the store holds;
//   - be safe to call concurrently with every other call of the Store
//     (Get, Scan, Commit, iterators, another Reclaim), and with the engine's
//     own background reclamation;
//   - not block Commit for long: a short pause (a memtable flush) is
//     acceptable, holding writes for the whole run is not, since Defragment
//     is run on live servers;
//   - return ErrClosed after Close, and the context's error if ctx ends
//     before the work starts.
//
// It may take long: minutes on a large store, since compacting rewrites the
// tables. Work that an engine cannot interrupt may run to its end after ctx
// is done; Reclaim then returns when it ends. Callers must not assume the
// disk use shrinks by any amount: what is given back, and when the files
// shrink, is the engine's business.
type Reclaimer interface {
	Reclaim(ctx context.Context) error
}
