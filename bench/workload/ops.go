package workload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/bench/result"
)

// The request shapes below are kube-apiserver's (k8s.io/apiserver
// storage/etcd3 through clientv3/kubernetes). K1, K2, K6, K7 and K8 are
// their labels in bench/README.md, "kube-apiserver's requests".

// createTxn is K6: Txn{If mod(key)==0 Then Put}.
func (r *runner) createTxn(ctx context.Context, cli *clientv3.Client, key string, value []byte) (*clientv3.TxnResponse, error) {
	return cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(value))).
		Commit()
}

// getKey is K1: a linearizable Range{key, limit 1}; it returns the key's
// mod revision, 0 when absent.
func getKey(ctx context.Context, cli *clientv3.Client, key string) (int64, error) {
	resp, err := cli.Get(ctx, key, clientv3.WithLimit(1))
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return resp.Kvs[0].ModRevision, nil
}

// updateKey is GuaranteedUpdate's round: Get (K1), then K7:
// Txn{If mod==rev Then Put Else Get}.
func (r *runner) updateKey(ctx context.Context, cli *clientv3.Client, key string) (bool, error) {
	rev, err := getKey(ctx, cli, key)
	if err != nil {
		return false, fmt.Errorf("get: %w", err)
	}
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
		Then(clientv3.OpPut(key, string(r.value))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return false, fmt.Errorf("txn: %w", err)
	}
	return !resp.Succeeded, nil
}

func (r *runner) create(ctx context.Context) (*result.Result, error) {
	ks := newKeyspace(r.cfg.Prefix, Create, r.cfg.KeySize, r.cfg.KeyOrder)
	var next atomic.Int64
	rec := newRecorder()
	return r.drive(ctx, Create, "ops/s", r.cfg.Clients, r.cfg.Rate, rec, func(ctx context.Context, c int) (bool, error) {
		resp, err := r.createTxn(ctx, r.conn(c), ks.key(int(next.Add(1))), r.value)
		if err != nil {
			return false, err
		}
		return !resp.Succeeded, nil
	}), nil
}

// load creates exactly DataSet objects and leaves them in place; it ends
// when they exist or the duration is over. With LoadBatch > 1 each
// transaction creates that many objects (If every mod=0 Then every Put):
// the same keys, values and versions in far fewer revisions, so a memory
// measurement of a million objects takes seconds rather than minutes. An
// operation is one transaction.
func (r *runner) load(ctx context.Context) (*result.Result, error) {
	batch := max(1, r.cfg.LoadBatch)
	var next, created atomic.Int64
	rec := newRecorder()
	res := r.drive(ctx, Load, "txns/s", r.cfg.Clients, r.cfg.Rate, rec, func(ctx context.Context, c int) (bool, error) {
		from := r.cfg.LoadFrom + int(next.Add(int64(batch))) - batch
		if from >= r.cfg.DataSet {
			return false, errStop
		}
		to := min(from+batch, r.cfg.DataSet)
		cmps := make([]clientv3.Cmp, 0, to-from)
		puts := make([]clientv3.Op, 0, to-from)
		for i := from; i < to; i++ {
			k := r.cfg.existingKey(i)
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", 0))
			puts = append(puts, clientv3.OpPut(k, objectValue(len(r.value))))
		}
		resp, err := r.conn(c).Txn(ctx).If(cmps...).Then(puts...).Commit()
		if err != nil {
			return false, err
		}
		if resp.Succeeded {
			created.Add(int64(to - from))
		}
		return !resp.Succeeded, nil
	})
	res.Writes = created.Load()
	if want := int64(r.cfg.DataSet - r.cfg.LoadFrom); res.Writes < want {
		return res, fmt.Errorf("created %d of %d objects within %s (%d errors)", res.Writes, want, r.cfg.Duration, res.Errors)
	}
	return res, nil
}

func (r *runner) get(ctx context.Context) (*result.Result, error) {
	ks := newKeyspace(r.cfg.Prefix, Get, r.cfg.KeySize, r.cfg.KeyOrder)
	keyOf := ks.key
	if r.cfg.Existing {
		keyOf = r.cfg.existingKey
	} else if _, err := r.preload(ctx, ks, r.cfg.DataSet); err != nil {
		return nil, err
	}
	rec := newRecorder()
	return r.drive(ctx, Get, "ops/s", r.cfg.Clients, r.cfg.Rate, rec, func(ctx context.Context, c int) (bool, error) {
		rev, err := getKey(ctx, r.conn(c), keyOf(rand.IntN(r.cfg.DataSet)))
		if err == nil && rev == 0 {
			err = fmt.Errorf("preloaded key missing")
		}
		return false, err
	}), nil
}

func (r *runner) update(ctx context.Context) (*result.Result, error) {
	ks := newKeyspace(r.cfg.Prefix, Update, r.cfg.KeySize, r.cfg.KeyOrder)
	if _, err := r.preload(ctx, ks, r.cfg.DataSet); err != nil {
		return nil, err
	}
	rec := newRecorder()
	return r.drive(ctx, Update, "ops/s", r.cfg.Clients, r.cfg.Rate, rec, func(ctx context.Context, c int) (bool, error) {
		return r.updateKey(ctx, r.conn(c), ks.key(rand.IntN(r.cfg.DataSet)))
	}), nil
}

func (r *runner) mixed(ctx context.Context) (*result.Result, error) {
	ks := newKeyspace(r.cfg.Prefix, Mixed, r.cfg.KeySize, r.cfg.KeyOrder)
	if _, err := r.preload(ctx, ks, r.cfg.DataSet); err != nil {
		return nil, err
	}
	var reads, writes atomic.Int64
	rec := newRecorder()
	res := r.drive(ctx, Mixed, "ops/s", r.cfg.Clients, r.cfg.Rate, rec, func(ctx context.Context, c int) (bool, error) {
		key := ks.key(rand.IntN(r.cfg.DataSet))
		if rand.Float64() < r.cfg.ReadRatio {
			reads.Add(1)
			_, err := getKey(ctx, r.conn(c), key)
			return false, err
		}
		writes.Add(1)
		return r.updateKey(ctx, r.conn(c), key)
	})
	res.Reads, res.Writes = reads.Load(), writes.Load()
	return res, nil
}

// delete is K8 on preloaded keys: Txn{If mod==rev Then DeleteRange Else
// Get}, with rev the key's revision known from the preload (kube-apiserver
// knows it from its watch cache). Each client deletes its own share of the
// keys; when the first client runs out, the measurement ends, so every
// client is busy for the whole measured interval.
func (r *runner) delete(ctx context.Context) (*result.Result, error) {
	ks := newKeyspace(r.cfg.Prefix, Delete, r.cfg.KeySize, r.cfg.KeyOrder)
	revs, err := r.preload(ctx, ks, r.cfg.DeleteKeys)
	if err != nil {
		return nil, err
	}
	n := min(r.cfg.Clients, r.cfg.DeleteKeys)
	nextOf := make([]int, n) // per client, the next index of its share
	for c := range nextOf {
		nextOf[c] = c
	}
	rec := newRecorder()
	return r.drive(ctx, Delete, "ops/s", n, r.cfg.Rate, rec, func(ctx context.Context, c int) (bool, error) {
		i := nextOf[c]
		if i >= len(revs) {
			return false, errStop
		}
		nextOf[c] += n
		key := ks.key(i)
		resp, err := r.conn(c).Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", revs[i])).
			Then(clientv3.OpDelete(key)).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return false, err
		}
		return !resp.Succeeded, nil
	}), nil
}

// list is the reflector's full paginated LIST (K2): the first page at the
// latest revision, later pages pinned to the first page's header revision,
// each continuing at lastKey+"\x00", until More is false. One operation is
// one complete list.
func (r *runner) list(ctx context.Context) (*result.Result, error) {
	ks := newKeyspace(r.cfg.Prefix, List, r.cfg.KeySize, r.cfg.KeyOrder)
	if r.cfg.Existing {
		// The first sub-prefix, which must hold exactly DataSet objects.
		ks = r.cfg.existingKeyspace(0)
	} else if _, err := r.preload(ctx, ks, r.cfg.DataSet); err != nil {
		return nil, err
	}
	var pages, keys atomic.Int64
	rec := newRecorder()
	res := r.drive(ctx, List, "lists/s", r.cfg.ListClients, r.cfg.Rate, rec, func(ctx context.Context, c int) (bool, error) {
		cli := r.conn(c)
		key, rev, got := ks.base, int64(0), 0
		for {
			resp, err := cli.Get(ctx, key, clientv3.WithRange(ks.end()), clientv3.WithLimit(int64(r.cfg.ListLimit)), clientv3.WithRev(rev))
			if err != nil {
				return false, fmt.Errorf("list page at %q rev %d: %w", key, rev, err)
			}
			pages.Add(1)
			keys.Add(int64(len(resp.Kvs)))
			got += len(resp.Kvs)
			if rev == 0 {
				rev = resp.Header.Revision
			}
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
		if got != r.cfg.DataSet {
			return false, fmt.Errorf("list returned %d keys, want %d", got, r.cfg.DataSet)
		}
		return false, nil
	})
	res.Pages, res.Keys = pages.Load(), keys.Load()
	if res.Seconds > 0 {
		res.KeysPerSec = float64(res.Keys) / res.Seconds
	}
	return res, nil
}

// preload writes n keys of ks (untimed) in transactions of many plain puts
// and returns each key's mod revision. Batching makes preloading fast on
// every store; it is not part of any measurement.
func (r *runner) preload(ctx context.Context, ks keyspace, n int) ([]int64, error) {
	note(r.cfg.Progress, "preloading %d keys under %s", n, ks.base)
	start := time.Now()
	// Stay well under etcd's 1.5 MiB request and 128-operation limits.
	batch := min(100, max(1, (1<<20)/(r.cfg.KeySize+r.cfg.ValueSize+32)))
	revs := make([]int64, n)
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	for w := range 4 * len(r.conns) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cli := r.conn(w)
			for {
				from := int(next.Add(int64(batch))) - batch
				if from >= n || ctx.Err() != nil {
					return
				}
				to := min(from+batch, n)
				ops := make([]clientv3.Op, 0, to-from)
				for i := from; i < to; i++ {
					ops = append(ops, clientv3.OpPut(ks.key(i), string(r.value)))
				}
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				resp, err := cli.Txn(cctx).Then(ops...).Commit()
				cancel()
				if err != nil {
					errOnce.Do(func() { first = fmt.Errorf("preload %s: %w", ks.base, err) })
					return
				}
				for i := from; i < to; i++ {
					revs[i] = resp.Header.Revision
				}
			}
		}()
	}
	wg.Wait()
	note(r.cfg.Progress, "")
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	r.log.Info("preloaded", "prefix", ks.base, "keys", n, "took", time.Since(start))
	return revs, first
}
