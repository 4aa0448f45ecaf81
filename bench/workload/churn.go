package workload

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/bench/result"
)

// Churn is a long run of updates on a fixed set of keys while a compactor
// shaped like kube-apiserver's runs every Config.CompactEvery: what a
// cluster's store sees for hours, and what its disk must survive.
// It is not part of "all": it is meant to run for minutes.
const Churn = "churn"

// compactRevKey is the key kube-apiserver's compactor keeps its round
// counter in (k8s.io/apiserver storage/etcd3/compact.go); the churn puts it
// under its own prefix so runs stay apart.
const compactRevKey = "compact_rev_key"

// seriesInterval is the width of one point of the churn's throughput series.
const seriesInterval = time.Second

// churn preloads DataSet keys and updates random ones for Duration with
// kube-apiserver's update transaction, Txn{If mod(k)=rev Then Put Else Get},
// where rev is the revision the client last saw for the key (kube-apiserver
// takes it from its watch cache, and from the Else Get after a conflict), so
// one operation is one transaction. Meanwhile it compacts as kube-apiserver's
// compactor does and records the throughput of every second.
func (r *runner) churn(ctx context.Context) (*result.Result, error) {
	ks := newKeyspace(r.cfg.Prefix, Churn, r.cfg.KeySize, r.cfg.KeyOrder)
	preloaded, err := r.preload(ctx, ks, r.cfg.DataSet)
	if err != nil {
		return nil, err
	}
	revs := make([]atomic.Int64, len(preloaded))
	for i, rev := range preloaded {
		revs[i].Store(rev)
	}

	rec := newRecorder()
	cctx, stopBackground := context.WithCancel(ctx)
	compactions := make(chan []result.Compaction, 1)
	series := make(chan []float64, 1)
	start := time.Now()
	go func() { compactions <- r.compactLoop(cctx, start) }()
	go func() { series <- sampleSeries(cctx, &rec.ops, seriesInterval) }()

	res := r.drive(ctx, Churn, "ops/s", r.cfg.Clients, r.cfg.Rate, rec, func(ctx context.Context, c int) (bool, error) {
		i := rand.IntN(len(revs))
		key := ks.key(i)
		resp, err := r.conn(c).Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", revs[i].Load())).
			Then(clientv3.OpPut(key, randomValue(r.cfg.ValueSize))).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return false, err
		}
		seen := resp.Header.Revision
		if !resp.Succeeded {
			kvs := resp.Responses[0].GetResponseRange().GetKvs()
			if len(kvs) == 0 {
				return true, fmt.Errorf("churn key %s missing", key)
			}
			seen = kvs[0].ModRevision
		}
		// Clients race on the same key: keep the newest revision seen, so
		// a slow client cannot put an older one back.
		for {
			old := revs[i].Load()
			if seen <= old || revs[i].CompareAndSwap(old, seen) {
				break
			}
		}
		return !resp.Succeeded, nil
	})
	stopBackground()
	res.Series = <-series
	// A tick between the last operation and the cancel would add a point
	// of an idle second.
	if n := int(res.Seconds / seriesInterval.Seconds()); len(res.Series) > n {
		res.Series = res.Series[:n]
	}
	res.SeriesInterval = seriesInterval.Seconds()
	res.Compactions = <-compactions
	return res, nil
}

// compactLoop is kube-apiserver's compactor (storage/etcd3/compact.go):
// every CompactEvery it bumps the version of compact_rev_key in a
// transaction (which elects one compactor among several apiservers) and, if
// it won, compacts at the revision it saw in the previous round, so history
// is kept for one interval. The compaction is not physical, as
// kube-apiserver's is not. It returns the compactions made.
func (r *runner) compactLoop(ctx context.Context, start time.Time) []result.Compaction {
	if r.cfg.CompactEvery <= 0 {
		return nil
	}
	var (
		done    []result.Compaction
		version int64 // compact_rev_key's version as last seen
		prev    int64 // the header revision of the previous round
	)
	cli := r.conns[0]
	key := r.cfg.Prefix + compactRevKey
	t := time.NewTicker(r.cfg.CompactEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return done
		case <-t.C:
		}
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Version(key), "=", version)).
			Then(clientv3.OpPut(key, fmt.Sprint(prev))).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			r.log.Warn("churn compactor", "err", err)
			continue
		}
		if !resp.Succeeded {
			// Another compactor won this round; follow its count.
			if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
				version = kvs[0].Version
			}
			prev = resp.Header.Revision
			continue
		}
		version++
		at := prev
		prev = resp.Header.Revision
		if at == 0 {
			continue // the first round only learns a revision
		}
		t0 := time.Now()
		if _, err := cli.Compact(ctx, at); err != nil {
			r.log.Warn("churn compaction", "revision", at, "err", err)
			continue
		}
		done = append(done, result.Compaction{Revision: at, At: t0.Sub(start).Seconds(), Seconds: time.Since(t0).Seconds()})
		r.log.Info("churn compacted", "revision", at)
	}
}

// randomValue is a fresh random value for every write: the churn measures
// disk use, and the one value other workloads repeat would let a
// compressing engine (badger with Snappy) store ten thousand keys in less
// than the live data, which no real set of objects allows.
func randomValue(n int) string {
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rand.Uint64())
	}
	return string(b[:n])
}

// sampleSeries records, every interval until ctx ends, how many operations
// completed in it, per second. A last partial interval is dropped: its rate
// would be measured over a fraction of the width.
func sampleSeries(ctx context.Context, ops *atomic.Int64, interval time.Duration) []float64 {
	var out []float64
	t := time.NewTicker(interval)
	defer t.Stop()
	last, lastAt := ops.Load(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return out
		case now := <-t.C:
			n := ops.Load()
			out = append(out, float64(n-last)/now.Sub(lastAt).Seconds())
			last, lastAt = n, now
		}
	}
}
