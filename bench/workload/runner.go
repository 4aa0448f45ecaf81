package workload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/engramkv/engram/bench/result"
)

// Run executes the named workloads one after the other against cfg's
// endpoints and reports each. It returns the results gathered so far with
// the first error that stopped the run (a failed preload, an unreachable
// endpoint, a cancelled ctx); errors of single requests are counted in the
// results instead.
func Run(ctx context.Context, cfg Config, workloads []string) (*result.Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r, err := newRunner(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer r.close()

	rep := &result.Report{
		Tool:      cfg.Tool,
		Server:    r.serverVersion(ctx),
		Endpoints: cfg.Endpoints,
		Started:   time.Now().UTC(),
		Params: result.Params{
			Clients: cfg.Clients, Connections: cfg.Connections, KeySize: cfg.KeySize, ValueSize: cfg.ValueSize, KeyOrder: cfg.KeyOrder,
			DataSet: cfg.DataSet, DeleteKeys: cfg.DeleteKeys, Duration: cfg.Duration.String(), Rate: cfg.Rate,
			Prefix: cfg.Prefix, ListLimit: cfg.ListLimit, ListClients: cfg.ListClients, ReadRatio: cfg.ReadRatio,
			Watchers: cfg.Watchers, WatchRate: cfg.WatchRate, LoadBatch: cfg.LoadBatch,
		},
	}
	for _, name := range workloads {
		r.log.Info("workload starting", "workload", name)
		res, err := r.run(ctx, name)
		if err != nil {
			return rep, fmt.Errorf("%s: %w", name, err)
		}
		rep.Results = append(rep.Results, *res)
		if cfg.Cleanup && name != Load && name != SmallCluster {
			if err := r.cleanup(ctx, name); err != nil {
				return rep, fmt.Errorf("%s: cleanup: %w", name, err)
			}
		}
	}
	return rep, nil
}

// runner holds the connections of one Run.
type runner struct {
	cfg   Config
	log   *slog.Logger
	conns []*clientv3.Client
	// value is the payload of every write: random bytes, so compressing
	// stores gain nothing from it.
	value []byte
	// base is the origin of the send timestamps the watch workload puts in
	// values (monotonic, so wall-clock steps cannot distort latencies).
	base time.Time
}

func newRunner(ctx context.Context, cfg Config) (*runner, error) {
	r := &runner{cfg: cfg, log: cfg.Logger, base: time.Now(), value: make([]byte, cfg.ValueSize)}
	for i := range r.value {
		r.value[i] = byte(rand.Uint32())
	}
	for range cfg.Connections {
		c, err := clientv3.New(clientv3.Config{
			Endpoints:   cfg.Endpoints,
			DialTimeout: cfg.DialTimeout,
			TLS:         cfg.TLS,
			Logger:      zap.NewNop(),
			Context:     ctx,
			// As kube-apiserver (storagebackend/factory/etcd3.go).
			DialKeepAliveTime:    30 * time.Second,
			DialKeepAliveTimeout: 10 * time.Second,
		})
		if err != nil {
			r.close()
			return nil, fmt.Errorf("connect to %v: %w", cfg.Endpoints, err)
		}
		r.conns = append(r.conns, c)
	}
	// clientv3.New dials lazily: one request makes an unreachable endpoint
	// fail here rather than as errors in every workload.
	cctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if _, err := r.conns[0].Get(cctx, cfg.Prefix+"probe"); err != nil {
		r.close()
		return nil, fmt.Errorf("reach %v: %w", cfg.Endpoints, err)
	}
	return r, nil
}

func (r *runner) close() {
	for _, c := range r.conns {
		_ = c.Close()
	}
}

// conn is the connection client i uses: round-robin, as the benchmarks'
// model of 300 clients over 10 connections.
func (r *runner) conn(i int) *clientv3.Client { return r.conns[i%len(r.conns)] }

func (r *runner) serverVersion(ctx context.Context) string {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.DialTimeout)
	defer cancel()
	st, err := r.conns[0].Status(cctx, r.cfg.Endpoints[0])
	if err != nil {
		return ""
	}
	return st.Version
}

// workloads maps each workload's name to the runner method that runs it.
var workloads = map[string]func(*runner, context.Context) (*result.Result, error){
	Create:       (*runner).create,
	Get:          (*runner).get,
	Update:       (*runner).update,
	List:         (*runner).list,
	Delete:       (*runner).delete,
	Mixed:        (*runner).mixed,
	Watch:        (*runner).watch,
	Load:         (*runner).load,
	Churn:        (*runner).churn,
	SmallCluster: (*runner).smallCluster,
}

func (r *runner) run(ctx context.Context, name string) (*result.Result, error) {
	run, ok := workloads[name]
	if !ok {
		return nil, fmt.Errorf("unknown workload %q", name)
	}
	return run(r, ctx)
}

// cleanup deletes a workload's keys and compacts the history they left, as
// kube-apiserver's compactor would, so the next workload starts on a store
// of the same size and with no compaction still running. It deletes in ranges of at most cleanupChunk keys: a
// single DeleteRange over a whole create run (tens of thousands of keys) is
// nothing kube-apiserver ever sends, and one store refusing it must not end
// the run.
func (r *runner) cleanup(ctx context.Context, name string) error {
	const cleanupChunk = 5000
	ks := newKeyspace(r.cfg.Prefix, name, r.cfg.KeySize, r.cfg.KeyOrder)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cli := r.conns[0]
	var rev int64
	// Each page starts after the last deleted key: on a store that is the
	// same as starting over, and it also ends against the ceiling, which
	// never deletes anything.
	for from := ks.base; ; {
		page, err := cli.Get(cctx, from, clientv3.WithRange(ks.end()), clientv3.WithLimit(cleanupChunk), clientv3.WithKeysOnly())
		if err != nil {
			return fmt.Errorf("list %s: %w", ks.base, err)
		}
		rev = page.Header.Revision
		if len(page.Kvs) == 0 {
			break
		}
		last := string(page.Kvs[len(page.Kvs)-1].Key) + "\x00"
		resp, err := cli.Delete(cctx, from, clientv3.WithRange(last))
		if err != nil {
			return fmt.Errorf("delete %d keys under %s: %w", len(page.Kvs), ks.base, err)
		}
		rev = resp.Header.Revision
		if !page.More {
			break
		}
		from = last
	}
	// Physical: wait until the store has removed the history, so that
	// the next workload measures itself and not this one's cleanup (both
	// etcd and Engram compact in the background otherwise).
	if _, err := cli.Compact(cctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return fmt.Errorf("compact at %d: %w", rev, err)
	}
	return nil
}

// errStop ends a client's loop without counting an error (delete ran out of
// keys, load created its share).
var errStop = errors.New("stop")

// opFunc is one operation of client c; it reports whether a transaction's
// compare failed.
type opFunc func(ctx context.Context, c int) (failedCompare bool, err error)

// drive runs n closed-loop clients calling op until the duration is over (or
// an op returns errStop) and returns the measurement. Operations already
// started when time is up run to completion and count: cancelling them
// would count work the server did as lost.
func (r *runner) drive(ctx context.Context, name, unit string, n int, rate float64, rec *recorder, op opFunc) *result.Result {
	var (
		wg      sync.WaitGroup
		stopped atomic.Bool
		pace    = newPacer(rate)
		start   = time.Now()
		end     = start.Add(r.cfg.Duration)
	)
	pace.start(start)
	// The make bench harness starts a server-side CPU profile on this line,
	// so that the profile covers the measured interval and not the preload.
	r.log.Info("measuring", "workload", name, "duration", r.cfg.Duration)
	stopProgress := startProgress(r.cfg.Progress, name, start, r.cfg.Duration, &rec.ops, &rec.errs)
	for c := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stopped.Load() && ctx.Err() == nil && time.Now().Before(end) {
				if err := pace.wait(ctx, end); err != nil {
					return
				}
				t0 := time.Now()
				failed, err := op(ctx, c)
				if errors.Is(err, errStop) {
					stopped.Store(true)
					return
				}
				if !rec.outcome(ctx, c, t0, failed, err) {
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopProgress()
	res := rec.result(name, unit, elapsed)
	// With "measuring", this brackets the interval for the harness, which
	// reads the server's CPU time at both lines.
	r.log.Info("measured", "workload", name, "ops", res.Ops, "seconds", res.Seconds)
	return res
}

// pacer spaces operations evenly at a fixed rate over all clients: slot k
// may start at start + k/rate. A nil pacer does not wait.
type pacer struct {
	t0       time.Time
	interval float64 // nanoseconds per operation
	next     atomic.Int64
}

func newPacer(rate float64) *pacer {
	if rate <= 0 {
		return nil
	}
	return &pacer{interval: 1e9 / rate}
}

func (p *pacer) start(t time.Time) {
	if p != nil {
		p.t0 = t
	}
}

// wait blocks until the caller's slot. It returns errStop at once when the
// slot lies at or after end: with many clients sharing a low rate, waiting
// for such a slot would only stretch the measured interval.
func (p *pacer) wait(ctx context.Context, end time.Time) error {
	if p == nil {
		return nil
	}
	slot := p.next.Add(1) - 1
	at := p.t0.Add(time.Duration(float64(slot) * p.interval))
	if !at.Before(end) {
		return errStop
	}
	d := time.Until(at)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
