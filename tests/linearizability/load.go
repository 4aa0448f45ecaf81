package linearizability

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/engramkv/engram/internal/periodic"
)

// LoadOptions shape the concurrent clients of a run.
type LoadOptions struct {
	// Endpoints each client connects to (clientv3 spreads requests over
	// them).
	Endpoints []string
	// Clients is the number of concurrent clients, each with its own
	// connection.
	Clients int
	// Rate is the total operations per second the clients aim at.
	Rate float64
	// OpTimeout bounds one operation; a write that times out is unknown.
	OpTimeout time.Duration
	// Seed makes each client's choice of operations reproducible (client
	// i uses Seed+i); the interleaving with the server is not.
	Seed int64
	// Pinned connects client i to Endpoints[i % len(Endpoints)] alone, so
	// that a failure can be put down to one node (the upgrade run).
	Pinned bool
}

// Failure is an operation a client did not get an answer to.
type Failure struct {
	Client   int
	Endpoint string // the client's endpoint when pinned, else ""
	At       int64  // Recorder time the operation was sent
	Err      string
}

// Load is a running set of clients recording into a Recorder.
type Load struct {
	rec    *Recorder
	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   atomic.Int64

	mu       sync.Mutex
	failures []Failure
}

// StartLoad connects the clients and starts them. Stop ends them.
func StartLoad(ctx context.Context, rec *Recorder, opts LoadOptions) (*Load, error) {
	ctx, cancel := context.WithCancel(ctx)
	l := &Load{rec: rec, cancel: cancel}
	interval := time.Duration(float64(opts.Clients) / opts.Rate * float64(time.Second))
	var clis []*clientv3.Client
	for i := range opts.Clients {
		eps := opts.Endpoints
		if opts.Pinned {
			eps = []string{eps[i%len(eps)]}
		}
		cli, err := NewClient(eps)
		if err != nil {
			cancel()
			for _, c := range clis {
				_ = c.Close()
			}
			return nil, err
		}
		clis = append(clis, cli)
		c := &client{id: i, cli: cli, rec: rec, rng: rand.New(rand.NewSource(opts.Seed + int64(i))), timeout: opts.OpTimeout, load: l}
		if opts.Pinned {
			c.endpoint = eps[0]
		}
		l.wg.Go(func() {
			defer cli.Close()
			// The ticker paces the client (Rate), it does not synchronise
			// anything; ticks missed while an operation runs are dropped.
			periodic.Run(ctx, interval, c.step)
		})
	}
	return l, nil
}

// Stop ends the clients and waits for their last operations.
func (l *Load) Stop() {
	l.cancel()
	l.wg.Wait()
}

// Errors is how many operations failed so far.
func (l *Load) Errors() int64 { return l.errs.Load() }

// Failures lists the operations that failed so far, but those cut short
// by Stop.
func (l *Load) Failures() []Failure {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.failures)
}

func (l *Load) fail(f Failure) {
	l.mu.Lock()
	l.failures = append(l.failures, f)
	l.mu.Unlock()
}

// NewClient connects a client to endpoints, without logging.
func NewClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
}

type client struct {
	id       int
	endpoint string // when pinned
	cli      *clientv3.Client
	rec      *Recorder
	rng      *rand.Rand
	timeout  time.Duration
	load     *Load
	seq      int
	// lastMod is the mod revision of each key this client last saw, the
	// revision its compare-and-swaps expect.
	lastMod [NumKeys]int64
}

func (c *client) step(ctx context.Context) {
	req := Request{Key: c.rng.Intn(NumKeys)}
	switch r := c.rng.Intn(100); {
	case r < 40:
		req.Kind = Get
	case r < 60:
		req.Kind = Put
	case r < 80:
		req.Kind = CAS
		req.ModRev = c.lastMod[req.Key]
	case r < 95:
		req.Kind = Delete
	default:
		req.Kind = Range
	}
	if req.Kind == Put || req.Kind == CAS {
		c.seq++
		req.Value = fmt.Sprintf("c%d-%d", c.id, c.seq)
	}
	at := c.rec.Now()
	op := Do(ctx, c.cli, c.rec, c.timeout, Op{Client: c.id, Req: req})
	if op == nil || op.Resp.Unknown {
		note := "read failed"
		if op != nil {
			note = op.Note
		}
		c.load.errs.Add(1)
		if ctx.Err() == nil {
			// Not the load stopping under it.
			c.load.fail(Failure{Client: c.id, Endpoint: c.endpoint, At: at, Err: note})
		}
		return
	}
	switch req.Kind {
	case Range:
		for k, kv := range op.Resp.All {
			c.lastMod[k] = kv.Mod
		}
	case Put:
		c.lastMod[req.Key] = op.Resp.Rev
	case CAS:
		if op.Resp.Succeeded {
			c.lastMod[req.Key] = op.Resp.Rev
		} else {
			c.lastMod[req.Key] = op.Resp.KV.Mod
		}
	case Delete:
		c.lastMod[req.Key] = 0
	default:
		c.lastMod[req.Key] = op.Resp.KV.Mod
	}
}

// Do runs op's request, records op with its times and response and
// returns it; nil when a read failed (not recorded). A failed write is
// recorded as unknown.
func Do(ctx context.Context, cli *clientv3.Client, rec *Recorder, timeout time.Duration, op Op) *Op {
	req := op.Req
	octx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	op.Call = rec.Now()
	resp, err := execute(octx, cli, req)
	op.Return = rec.Now()
	if err != nil {
		if !req.Kind.IsWrite() {
			return nil
		}
		op.Return, op.Resp = Pending, Response{Unknown: true}
		op.Note = strings.TrimPrefix(op.Note+"; "+shortErr(err), "; ")
	} else {
		op.Resp = resp
	}
	rec.Add(op)
	return &op
}

func shortErr(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, rpctypes.ErrNoLeader):
		return "no leader"
	}
	s := err.Error()
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

func fromKV(kv *mvccpb.KeyValue) KeyValue {
	if kv == nil {
		return KeyValue{}
	}
	return KeyValue{Value: string(kv.Value), Create: kv.CreateRevision, Mod: kv.ModRevision, Version: kv.Version}
}

func first(kvs []*mvccpb.KeyValue) *mvccpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}

func execute(ctx context.Context, cli *clientv3.Client, req Request) (Response, error) {
	key := KeyName(req.Key)
	switch req.Kind {
	case Get:
		r, err := cli.Get(ctx, key)
		if err != nil {
			return Response{}, err
		}
		return Response{Rev: r.Header.Revision, KV: fromKV(first(r.Kvs))}, nil
	case Range:
		r, err := cli.Get(ctx, KeyPrefix, clientv3.WithPrefix())
		if err != nil {
			return Response{}, err
		}
		resp := Response{Rev: r.Header.Revision}
		for _, kv := range r.Kvs {
			k := KeyIndex(string(kv.Key))
			if k < 0 {
				return Response{}, fmt.Errorf("range returned a key outside the set: %q", kv.Key)
			}
			resp.All[k] = fromKV(kv)
		}
		return resp, nil
	case Put:
		r, err := cli.Put(ctx, key, req.Value, clientv3.WithPrevKV())
		if err != nil {
			return Response{}, err
		}
		return Response{Rev: r.Header.Revision, KV: fromKV(r.PrevKv)}, nil
	case Delete:
		r, err := cli.Delete(ctx, key, clientv3.WithPrevKV())
		if err != nil {
			return Response{}, err
		}
		return Response{Rev: r.Header.Revision, Deleted: r.Deleted, KV: fromKV(first(r.PrevKvs))}, nil
	case CAS:
		r, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", req.ModRev)).
			Then(clientv3.OpPut(key, req.Value)).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return Response{}, err
		}
		resp := Response{Rev: r.Header.Revision, Succeeded: r.Succeeded}
		if !r.Succeeded {
			if len(r.Responses) != 1 || r.Responses[0].GetResponseRange() == nil {
				return Response{}, fmt.Errorf("cas: else branch answered %v", r.Responses)
			}
			resp.KV = fromKV(first(r.Responses[0].GetResponseRange().Kvs))
		}
		return resp, nil
	}
	return Response{}, fmt.Errorf("unknown operation %v", req.Kind)
}

// Readback reads every key until it succeeds (or ctx ends) and records the
// read as a read-back: every write acknowledged before it must show.
func Readback(ctx context.Context, cli *clientv3.Client, rec *Recorder, clientID int, note string) (*Op, error) {
	// Retried at a fixed pace while the server comes back: pacing, not
	// synchronisation.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		op := Do(ctx, cli, rec, 2*time.Second, Op{Client: clientID, Req: Request{Kind: Range}, Readback: true, Note: note})
		if op != nil {
			return op, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read-back %s: %w", note, ctx.Err())
		case <-tick.C:
		}
	}
}
