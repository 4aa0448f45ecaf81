package etcdapi

import (
	"log/slog"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/kv"
)

// sizeWindow is how long a measured store size is trusted. Within it the
// size is the last measurement plus the cost of every write admitted since,
// so a burst of writes cannot slip past the quota on a stale figure; what
// the window can miss is only space freed meanwhile (deletes, compaction),
// which errs on the refusing side, and Defragment and a disarm measure
// again at once. badger's own size estimate moves far more slowly than
// this (it recomputes it about once a minute), so a shorter window would
// buy nothing but engine calls.
const sizeWindow = time.Second

// Cost of a write against the quota, as etcd counts it
// (server/storage/quota.go): per key-value and per lease a fixed overhead
// besides the bytes themselves.
const (
	kvOverhead    = 256
	leaseOverhead = 64
)

// quota tracks the store's size against the configured quota without an
// engine call per request.
type quota struct {
	limit int64 // 0: no quota
	sizer kv.Sizer

	mu       sync.Mutex
	size     int64
	measured time.Time
}

// used returns the store's size as the quota sees it, measuring again once
// the window has passed.
func (q *quota) used(now time.Time) int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.measured.IsZero() || now.Sub(q.measured) >= sizeWindow {
		if n, err := q.sizer.Size(); err == nil {
			q.size, q.measured = n, now
		}
	}
	return q.size
}

// admit reports whether a write of cost bytes fits under the quota, and
// counts it into the size when it does.
func (q *quota) admit(cost int) bool {
	if q == nil || cost == 0 {
		return true
	}
	used := q.used(time.Now())
	q.mu.Lock()
	defer q.mu.Unlock()
	if used+int64(cost) >= q.limit {
		return false
	}
	q.size += int64(cost)
	return true
}

// remeasure makes the next check measure the store again (space was given
// back, or an operator disarmed the alarm and expects the truth).
func (q *quota) remeasure() {
	if q == nil {
		return
	}
	q.mu.Lock()
	q.measured = time.Time{}
	q.mu.Unlock()
}

// writeCost is what a write request adds to the store for the quota, as
// etcd counts it: a Put its key and value, a Txn the larger of its two
// branches (nested Txns included), a lease grant a fixed amount; reads and
// deletes nothing.
func writeCost(r any) int {
	switch r := r.(type) {
	case *pb.PutRequest:
		return kvOverhead + len(r.Key) + len(r.Value)
	case *pb.TxnRequest:
		return max(opsCost(r.Success), opsCost(r.Failure))
	case *pb.LeaseGrantRequest:
		return leaseOverhead
	}
	return 0
}

func opsCost(ops []*pb.RequestOp) int {
	n := 0
	for _, op := range ops {
		if p := op.GetRequestPut(); p != nil {
			n += writeCost(p)
		} else if t := op.GetRequestTxn(); t != nil {
			n += writeCost(t)
		}
	}
	return n
}

// newQuota returns the quota of limit bytes over store, or nil for no
// quota. An engine that cannot tell its size cannot be held to a quota:
// that is logged once, not refused, as the store works without one.
func newQuota(limit int64, store kv.Store, log *slog.Logger) *quota {
	if limit <= 0 {
		return nil
	}
	sz, ok := store.(kv.Sizer)
	if !ok {
		log.Warn("quota-backend-bytes is ignored: the storage engine does not report its size", "quota", limit)
		return nil
	}
	return &quota{limit: limit, sizer: sz}
}
