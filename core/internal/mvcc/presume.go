package mvcc

import (
	"bytes"
	"errors"
	"fmt"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// Presumed absence: a create's key is presumed absent instead of read.
//
// kube-apiserver creates an object with one shape of transaction: "if the
// key's mod revision is 0, put it". Its key is new in the common case (a
// pod's generated name), so the read ahead (prefetch.go) finds nothing: on
// badger a miss through every LSM level, on a SQL or TiKV engine a round
// trip, per create. The batch the writer builds checks the same thing
// again at commit: a key the writer takes for absent is written with
// put-if-absent on its revision key (group.batch). So when the
// latest-record cache does not know a create's key, the request presumes
// it absent and reads nothing.
//
// Why it is safe:
//
//   - A presumed record is used only for a create (presumable): its compare
//     holds if the key is absent, and then it only puts the key. Everything
//     the writer derives from the presumption (the compare's outcome, the
//     new version, the event without a previous version) reaches a client
//     or a watcher only after the group committed, and the group commits
//     only if the put-if-absent of that revision key held: the key was
//     absent at commit. The engine checks the condition; the writer's
//     single-writer order makes "absent at commit" "absent at the
//     request's revision".
//   - When the presumption was wrong, the engine refuses the whole batch
//     with a conflict naming the first failing op (the kv contract). A
//     conflict on the revision key of a key the group presumed absent is
//     not a second writer: the committer sends every request of the group
//     round again (errPresumedAbsent), like the groups behind it, and
//     nothing of it was answered or published. The writer noted the key as
//     written by that group (writeSeqs), so on the next evaluation the
//     request's read-ahead looks stale and the writer reads the key: a
//     presumption fails at most once per request.
//   - A second writer (a deposed leader) that created the key meanwhile is
//     found as before: the next attempt reads its record and the batch then
//     fails on the change log or the fence.
//
// What it costs when wrong: one failed commit and a re-evaluation of the
// group, with the group's keys read by the writer. A key that exists
// without the cache knowing it is an object created again under a name
// that is taken, or one whose tombstone left the cache; after each failed
// presumption, the next presumeHoldoff creates read their keys (DESIGN.md,
// "Presumed absence").

// presumeHoldoff is how many creates of keys the cache does not know read
// their key instead of presuming after a presumption failed: under a load of creates of existing keys, at
// most one group in that many fails for it.
const presumeHoldoff = 1000

// errPresumedAbsent is a commit refused because a key presumed absent
// exists: nothing was written and the group's requests are evaluated
// again.
var errPresumedAbsent = errors.New("mvcc: a key presumed absent exists")

// presumption is the backend's state of presumed absence.
type presumption struct {
	// holdoff counts the creates that still read their key after a
	// presumption failed.
	holdoff atomic.Int64
	// off disables presumption (Options.ReadCreates).
	off bool
}

// allow reports whether a create may presume its key absent now, counting
// it against the holdoff if not.
func (p *presumption) allow() bool {
	if p.off {
		return false
	}
	for {
		n := p.holdoff.Load()
		if n <= 0 {
			return true
		}
		if p.holdoff.CompareAndSwap(n, n-1) {
			return false
		}
	}
}

// failed starts a holdoff after a presumption turned out wrong.
func (p *presumption) failed() { p.holdoff.Store(presumeHoldoff) }

// presumable returns the key t may presume absent: t is a create, with
// one compare that the key's mod revision, create revision or version is
// 0 (true exactly when the key is absent) and a success branch of one Put
// of that key that neither keeps the old value nor the old lease (both
// need the key to exist). nil otherwise. The failure branch, evaluated
// only if the key exists, may be anything: it is evaluated after a real
// read.
func presumable(t *pb.TxnRequest) []byte {
	if len(t.Compare) != 1 || len(t.Success) != 1 {
		return nil
	}
	c := t.Compare[0]
	if len(c.RangeEnd) != 0 || c.Result != pb.Compare_EQUAL {
		return nil
	}
	switch v := c.TargetUnion.(type) {
	case *pb.Compare_ModRevision:
		if v.ModRevision != 0 || c.Target != pb.Compare_MOD {
			return nil
		}
	case *pb.Compare_CreateRevision:
		if v.CreateRevision != 0 || c.Target != pb.Compare_CREATE {
			return nil
		}
	case *pb.Compare_Version:
		if v.Version != 0 || c.Target != pb.Compare_VERSION {
			return nil
		}
	default:
		return nil
	}
	put := t.Success[0].GetRequestPut()
	if put == nil || put.IgnoreValue || put.IgnoreLease || !bytes.Equal(put.Key, c.Key) {
		return nil
	}
	return c.Key
}

// presumedConflict returns errPresumedAbsent naming the key if err, the
// failure of g's commit, is a conflict on the revision key of a key g
// presumed absent, and nil otherwise.
func (g *group) presumedConflict(err error) error {
	c, ok := kv.AsConflict(err)
	if !ok {
		return nil
	}
	key, derr := coder.DecodeRevisionKey(c.Key)
	if derr != nil {
		return nil
	}
	if s, ok := g.keys[string(key)]; !ok || !s.presumed {
		return nil
	}
	return fmt.Errorf("%w: %q", errPresumedAbsent, key)
}
