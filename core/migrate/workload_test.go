package migrate_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// writer writes to a source and remembers the highest revision any write
// was acknowledged at.
type writer struct {
	cli    *clientv3.Client
	maxRev atomic.Int64
	ops    atomic.Int64

	mu sync.Mutex
	// acked, when a test asked for it (nextAck), is closed at the next
	// acknowledgement.
	acked chan struct{}
}

func (w *writer) ack(rev int64) {
	w.ops.Add(1)
	for {
		cur := w.maxRev.Load()
		if rev <= cur || w.maxRev.CompareAndSwap(cur, rev) {
			break
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.acked != nil {
		close(w.acked)
		w.acked = nil
	}
}

// nextAck returns a channel closed at the next acknowledged write. Take it
// before reading ops or maxRev, so that no acknowledgement falls in
// between.
func (w *writer) nextAck() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.acked == nil {
		w.acked = make(chan struct{})
	}
	return w.acked
}

func (w *writer) put(ctx context.Context, key, val string, opts ...clientv3.OpOption) error {
	r, err := w.cli.Put(ctx, key, val, opts...)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	w.ack(r.Header.Revision)
	return nil
}

func (w *writer) del(ctx context.Context, key string, opts ...clientv3.OpOption) error {
	r, err := w.cli.Delete(ctx, key, opts...)
	if err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	w.ack(r.Header.Revision)
	return nil
}

func (w *writer) txn(ctx context.Context, cmp []clientv3.Cmp, then, els []clientv3.Op) error {
	r, err := w.cli.Txn(ctx).If(cmp...).Then(then...).Else(els...).Commit()
	if err != nil {
		return fmt.Errorf("txn: %w", err)
	}
	w.ack(r.Header.Revision)
	return nil
}

func (w *writer) grant(ctx context.Context) (clientv3.LeaseID, error) {
	r, err := w.cli.Grant(ctx, leaseTTL)
	if err != nil {
		return 0, fmt.Errorf("grant: %w", err)
	}
	return r.ID, nil
}

func (w *writer) revoke(ctx context.Context, id clientv3.LeaseID) error {
	r, err := w.cli.Revoke(ctx, id)
	if err != nil {
		return fmt.Errorf("revoke %x: %w", id, err)
	}
	w.ack(r.Header.Revision)
	return nil
}

func (w *writer) compact(ctx context.Context, rev int64) error {
	if _, err := w.cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return fmt.Errorf("compact %d: %w", rev, err)
	}
	return nil
}

// preload writes a history to the source under each prefix: puts,
// updates, multi-op transactions (sub revisions > 0), deletes, a range
// delete, keys attached to leases and a revoked lease, with a compaction
// halfway. It returns the compacted revision.
func preload(ctx context.Context, w *writer, rnd *rand.Rand, prefixes []string, n int) (int64, error) {
	var leases []clientv3.LeaseID
	for range 3 {
		id, err := w.grant(ctx)
		if err != nil {
			return 0, err
		}
		leases = append(leases, id)
	}
	key := func(p string, i int) string { return fmt.Sprintf("%sk%04d", p, i) }
	var compactRev int64
	for step := range 2 {
		for _, p := range prefixes {
			for i := range n / 2 {
				var opts []clientv3.OpOption
				if i%10 == 3 {
					opts = append(opts, clientv3.WithLease(leases[i%len(leases)]))
				}
				if err := w.put(ctx, key(p, rnd.IntN(n)), fmt.Sprintf("v%d-%d", step, i), opts...); err != nil {
					return 0, err
				}
			}
			for i := range n / 20 {
				a, b, c := rnd.IntN(n), rnd.IntN(n), rnd.IntN(n)
				if a == b || b == c || a == c {
					continue
				}
				err := w.txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.Version(key(p, a)), ">", 0)},
					[]clientv3.Op{clientv3.OpPut(key(p, a), fmt.Sprintf("t%d", i)), clientv3.OpPut(key(p, b), "tb"), clientv3.OpDelete(key(p, c))},
					[]clientv3.Op{clientv3.OpPut(key(p, b), "eb"), clientv3.OpPut(key(p, c), "ec", clientv3.WithLease(leases[0]))})
				if err != nil {
					return 0, err
				}
			}
			for range n / 10 {
				if err := w.del(ctx, key(p, rnd.IntN(n))); err != nil {
					return 0, err
				}
			}
			// A range delete: several keys, one revision.
			if err := w.del(ctx, fmt.Sprintf("%sk%03d", p, rnd.IntN(n/10)), clientv3.WithPrefix()); err != nil {
				return 0, err
			}
		}
		if step == 0 {
			compactRev = w.maxRev.Load()
			if err := w.compact(ctx, compactRev); err != nil {
				return 0, err
			}
		}
	}
	// A revoked lease deletes its keys in one revision.
	if err := w.revoke(ctx, leases[1]); err != nil {
		return 0, err
	}
	return compactRev, nil
}

// loadWriters runs nw concurrent writers of ops operations each on keys
// keys under each of prefixes (writer 0 also grants a lease every 100
// operations, attaches keys to it and revokes the one before), until done,
// ctx ends or stop is closed.
func loadWriters(ctx context.Context, w *writer, prefixes []string, keys, nw, ops int, stop <-chan struct{}) error {
	return parallel(ctx, nw, nw, func(ctx context.Context, id int) error {
		rnd := rand.New(rand.NewPCG(uint64(id), 42))
		key := func() string {
			return fmt.Sprintf("%sw%03d", prefixes[rnd.IntN(len(prefixes))], rnd.IntN(keys))
		}
		var lease, old clientv3.LeaseID
		for i := range ops {
			select {
			case <-stop:
				return nil
			default:
			}
			if id == 0 && i%100 == 0 {
				if old != 0 {
					if err := w.revoke(ctx, old); err != nil {
						return err
					}
				}
				old = lease
				l, err := w.grant(ctx)
				if err != nil {
					return err
				}
				lease = l
			}
			var err error
			switch op := rnd.IntN(20); {
			case op < 8:
				err = w.put(ctx, key(), fmt.Sprintf("w%d-%d", id, i))
			case op < 10 && lease != 0:
				err = w.put(ctx, key(), "leased", clientv3.WithLease(lease))
			case op < 14:
				err = w.del(ctx, key())
			case op < 19:
				k1, k2, k3 := key(), key(), key()
				if k1 == k2 || k2 == k3 || k1 == k3 {
					continue
				}
				err = w.txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k1), ">", 0)},
					[]clientv3.Op{clientv3.OpPut(k1, "t1"), clientv3.OpPut(k2, "t2"), clientv3.OpDelete(k3)},
					[]clientv3.Op{clientv3.OpPut(k1, "e1"), clientv3.OpDelete(k2)})
			default:
				p := prefixes[rnd.IntN(len(prefixes))]
				err = w.del(ctx, fmt.Sprintf("%sw%02d", p, rnd.IntN(keys/10)), clientv3.WithPrefix())
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}
