package migrate_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/migrate"
	"github.com/engramkv/engram/internal/etcdtest"
	"github.com/engramkv/engram/plugins/badger"
)

// leaseTTL is the TTL of every lease the tests grant: long enough that no
// lease expires while a test runs, so the source changes only when a test
// writes.
const leaseTTL = 3600

// testCtx is a context that ends with the test or after d, whichever is
// first: every wait in these tests is bounded by it.
func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// dial connects to an etcd v3 endpoint (etcd or Engram), closed at cleanup.
func dial(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:          []string{endpoint},
		DialTimeout:        5 * time.Second,
		Logger:             zap.NewNop(),
		MaxCallRecvMsgSize: 64 << 20,
	})
	if err != nil {
		t.Fatalf("dial %s: %v", endpoint, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// startSource starts a real etcd 3.6 and returns it with a client.
func startSource(t testing.TB) (*etcdtest.Etcd, *clientv3.Client) {
	t.Helper()
	e := etcdtest.Start(t, etcdtest.Options{})
	return e, dial(t, e.Endpoint)
}

// openBadger opens a badger store in dir (t.TempDir() when empty), closed
// at cleanup unless the test closed it already.
func openBadger(t testing.TB, dir string) *badger.Store {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	st, err := badger.Open(badger.Options{Dir: dir})
	if err != nil {
		t.Fatalf("open badger: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
			t.Errorf("close badger: %v", err)
		}
	})
	return st
}

// requireUnservable checks that the store holds an unfinished import, so
// no server opens it.
func requireUnservable(t testing.TB, st kv.Store) *mvcc.ImportRecord {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	b, err := mvcc.Open(ctx, mvcc.Options{Store: st, ReadOnly: true})
	if err == nil {
		_ = b.Close()
		t.Fatal("mvcc.Open accepted a store whose migration did not finish")
	}
	if !errors.Is(err, mvcc.ErrImportUnfinished) {
		t.Fatalf("mvcc.Open: %v, want ErrImportUnfinished", err)
	}
	rec, err := mvcc.ReadImportRecord(ctx, st)
	if err != nil || rec == nil {
		t.Fatalf("import record: %v, %v", rec, err)
	}
	return rec
}

// logBuffer collects a migration's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// hookHandler is a slog handler that writes to w and calls hook, in the
// logging goroutine, on the first record whose message starts with prefix:
// a test acts at an exact point of a migration that way (the migration
// waits while the hook runs).
type hookHandler struct {
	slog.Handler
	prefix string
	once   *sync.Once
	hook   func()
}

func newHookLogger(w *logBuffer, prefix string, hook func()) *slog.Logger {
	return slog.New(hookHandler{Handler: slog.NewTextHandler(w, nil), prefix: prefix, once: &sync.Once{}, hook: hook})
}

func (h hookHandler) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if strings.HasPrefix(r.Message, h.prefix) {
		h.once.Do(h.hook)
	}
	return err
}

func (h hookHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(as)
	return h
}

func (h hookHandler) WithGroup(name string) slog.Handler {
	h.Handler = h.Handler.WithGroup(name)
	return h
}

// progressLog records a migration's progress reports and, with the
// source's latest acknowledged revision, how far behind it was.
type progressLog struct {
	mu      sync.Mutex
	reports []migrate.Progress
	// behind: the writers' latest acknowledged revision minus Applied, at
	// each follow-phase report made while acked was set.
	behind []int64
	acked  func() int64
	notify chan struct{}
}

func newProgressLog(acked func() int64) *progressLog {
	return &progressLog{acked: acked, notify: make(chan struct{}, 1)}
}

func (p *progressLog) record(pr migrate.Progress) {
	p.mu.Lock()
	p.reports = append(p.reports, pr)
	if p.acked != nil && pr.Phase == "follow" {
		if a := p.acked(); a > 0 {
			p.behind = append(p.behind, max(a-pr.Applied, 0))
		}
	}
	p.mu.Unlock()
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// waitFor waits until a report satisfies ok, or ctx ends.
func (p *progressLog) waitFor(ctx context.Context, ok func(migrate.Progress) bool) (migrate.Progress, error) {
	for {
		p.mu.Lock()
		for _, r := range p.reports {
			if ok(r) {
				p.mu.Unlock()
				return r, nil
			}
		}
		n := len(p.reports)
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return migrate.Progress{}, fmt.Errorf("no such progress report among %d: %w", n, ctx.Err())
		case <-p.notify:
		}
	}
}

func (p *progressLog) snapshot() ([]migrate.Progress, []int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.reports), slices.Clone(p.behind)
}

// runResult is what a migration run in the background returned.
type runResult struct {
	res migrate.Result
	err error
}

// runAsync runs migrate.Run in a goroutine; the test waits for its result
// on the returned channel (the goroutine ends with ctx at the latest).
func runAsync(ctx context.Context, opts migrate.Options, cutover <-chan struct{}) <-chan runResult {
	ch := make(chan runResult, 1)
	go func() {
		res, err := migrate.Run(ctx, opts, cutover)
		ch <- runResult{res, err}
	}()
	return ch
}

// waitRun waits for a background migration's result, at most d.
func waitRun(t testing.TB, ch <-chan runResult, d time.Duration) runResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("migrate.Run did not return within %v", d)
		return runResult{}
	}
}

// closed is a closed cut-over channel: cut over as soon as caught up.
func closed() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// writer writes to a source and remembers the highest revision any write
// was acknowledged at.
type writer struct {
	cli    *clientv3.Client
	maxRev atomic.Int64
	ops    atomic.Int64
}

func (w *writer) ack(rev int64) {
	w.ops.Add(1)
	for {
		cur := w.maxRev.Load()
		if rev <= cur || w.maxRev.CompareAndSwap(cur, rev) {
			return
		}
	}
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

// event is a watch event as both sides must deliver it.
type event struct {
	typ  mvccpb.Event_EventType
	kv   mvccpb.KeyValue
	prev *mvccpb.KeyValue
}

func toEvent(ev *clientv3.Event) event {
	e := event{typ: ev.Type, kv: kvCopy(ev.Kv)}
	if ev.PrevKv != nil {
		p := kvCopy(ev.PrevKv)
		e.prev = &p
	}
	return e
}

func kvCopy(kv *mvccpb.KeyValue) mvccpb.KeyValue {
	return mvccpb.KeyValue{Key: kv.Key, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version, Value: kv.Value, Lease: kv.Lease}
}

func kvString(kv *mvccpb.KeyValue) string {
	if kv == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%q=%q create %d mod %d version %d lease %x", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
}

func (e event) String() string {
	return fmt.Sprintf("%s %s prev %s", e.typ, kvString(&e.kv), kvString(e.prev))
}

func (e event) rev() int64 { return e.kv.ModRevision }

// collectWatch watches the whole keyspace (or prefix) with prev_kv from
// `from` and returns every event up to `until`. Progress requests end it
// when the last revisions changed nothing it watches.
func collectWatch(ctx context.Context, cli *clientv3.Client, prefix string, from, until int64) ([]event, error) {
	if until < from {
		return nil, nil
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	key, opts := watchKey(prefix)
	wch := cli.Watch(wctx, key, append(opts, clientv3.WithRev(from), clientv3.WithPrevKV())...)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var evs []event
	for {
		select {
		case <-ctx.Done():
			return evs, fmt.Errorf("watch from %d: %d events, the last at %d: %w", from, len(evs), lastRev(evs), ctx.Err())
		case <-tick.C:
			// Answered once the watch has caught up.
			_ = cli.RequestProgress(wctx)
		case resp, ok := <-wch:
			if !ok {
				return evs, fmt.Errorf("watch from %d closed after %d events", from, len(evs))
			}
			if err := resp.Err(); err != nil {
				return evs, fmt.Errorf("watch from %d: %w", from, err)
			}
			if resp.IsProgressNotify() && resp.Header.Revision >= until {
				return evs, nil
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision > until {
					return evs, nil
				}
				evs = append(evs, toEvent(ev))
			}
			// A response holds whole revisions.
			if lastRev(evs) == until {
				return evs, nil
			}
		}
	}
}

func watchKey(prefix string) (string, []clientv3.OpOption) {
	if prefix == "" {
		return "\x00", []clientv3.OpOption{clientv3.WithFromKey()}
	}
	return prefix, []clientv3.OpOption{clientv3.WithPrefix()}
}

func lastRev(evs []event) int64 {
	if len(evs) == 0 {
		return 0
	}
	return evs[len(evs)-1].rev()
}

// diffEvents reports the first difference between two event streams.
func diffEvents(want, got []event) error {
	for i := range min(len(want), len(got)) {
		if a, b := want[i].String(), got[i].String(); a != b {
			return fmt.Errorf("event %d: source %s, target %s", i, a, b)
		}
	}
	if len(want) != len(got) {
		return fmt.Errorf("source sent %d events (last at %d), target %d (last at %d)", len(want), lastRev(want), len(got), lastRev(got))
	}
	return nil
}

// checkDense checks that evs cover every revision in [from, to] once and in
// order: revisions never go back, never skip one, and no (revision, key)
// comes twice. Every revision of an etcd history has at least one event.
func checkDense(evs []event, from, to int64) error {
	if len(evs) == 0 {
		if from <= to {
			return fmt.Errorf("no events for revisions %d..%d", from, to)
		}
		return nil
	}
	if evs[0].rev() != from {
		return fmt.Errorf("first event at revision %d, want %d", evs[0].rev(), from)
	}
	seen := map[string]bool{}
	for i := 1; i < len(evs); i++ {
		a, b := evs[i-1].rev(), evs[i].rev()
		switch {
		case b < a:
			return fmt.Errorf("event %d: revision went back from %d to %d", i, a, b)
		case b > a+1:
			return fmt.Errorf("event %d: revisions %d..%d missing", i, a+1, b-1)
		}
		k := fmt.Sprintf("%d/%s", b, evs[i].kv.Key)
		if seen[k] {
			return fmt.Errorf("event %d: key %q at revision %d delivered twice", i, evs[i].kv.Key, b)
		}
		seen[k] = true
	}
	if last := lastRev(evs); last != to {
		return fmt.Errorf("last event at revision %d, want %d", last, to)
	}
	return nil
}

// compareRanges compares the keys under prefix (the whole keyspace when
// prefix is "") on both sides at every step-th revision in [from, to] and
// at to, a few revisions at a time.
func compareRanges(ctx context.Context, src, dst *clientv3.Client, prefix string, from, to, step int64) error {
	key, opts := watchKey(prefix)
	var revs []int64
	for rev := from; rev < to; rev += step {
		revs = append(revs, rev)
	}
	if to >= from {
		revs = append(revs, to)
	}
	return parallel(ctx, len(revs), 4, func(ctx context.Context, i int) error {
		rev := revs[i]
		o := append(slices.Clone(opts), clientv3.WithRev(rev))
		a, err := src.Get(ctx, key, o...)
		if err != nil {
			return fmt.Errorf("source range at %d: %w", rev, err)
		}
		b, err := dst.Get(ctx, key, o...)
		if err != nil {
			return fmt.Errorf("target range at %d: %w", rev, err)
		}
		if a.Count != b.Count || len(a.Kvs) != len(b.Kvs) {
			return fmt.Errorf("range at %d: source %d keys, target %d", rev, a.Count, b.Count)
		}
		for i := range a.Kvs {
			if x, y := kvString(a.Kvs[i]), kvString(b.Kvs[i]); x != y {
				return fmt.Errorf("range at %d: source %s, target %s", rev, x, y)
			}
		}
		return nil
	})
}

// parallel runs fn for 0..n-1 on up to par goroutines; the first error
// cancels the others' ctx and is returned.
func parallel(ctx context.Context, n, par int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(n, par) {
		wg.Go(func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// hashKV returns a member's HashKV at rev with the compacted revision it
// was computed with. Asked for its current revision, it asks for revision
// 0 instead: etcd answers a HashKV at exactly a revision it compacted at
// (since it started) with the hash it computed while compacting, which
// covers the history from the compaction before; revision 0 is always
// computed afresh.
func hashKV(ctx context.Context, cli *clientv3.Client, rev int64) (uint32, int64, error) {
	cur, err := cli.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return 0, 0, err
	}
	ask := rev
	if cur.Header.Revision == rev {
		ask = 0
	}
	r, err := cli.HashKV(ctx, cli.Endpoints()[0], ask)
	if err != nil {
		return 0, 0, err
	}
	if r.HashRevision != rev {
		return 0, 0, fmt.Errorf("HashKV at %d hashed revision %d", rev, r.HashRevision)
	}
	return r.Hash, r.CompactRevision, nil
}

// leaseState is a lease as compared across the two sides.
type leaseState struct {
	id         clientv3.LeaseID
	grantedTTL int64
	keys       []string
}

// leases lists a member's leases with their attached keys under prefix.
func leases(ctx context.Context, cli *clientv3.Client, prefix string) ([]leaseState, error) {
	r, err := cli.Leases(ctx)
	if err != nil {
		return nil, err
	}
	var out []leaseState
	for _, l := range r.Leases {
		ttl, err := cli.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
		if err != nil {
			return nil, err
		}
		s := leaseState{id: l.ID, grantedTTL: ttl.GrantedTTL}
		for _, k := range ttl.Keys {
			if strings.HasPrefix(string(k), prefix) {
				s.keys = append(s.keys, string(k))
			}
		}
		slices.Sort(s.keys)
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b leaseState) int { return int(a.id - b.id) })
	return out, nil
}

func compareLeases(ctx context.Context, src, dst *clientv3.Client, prefix string) (int, error) {
	a, err := leases(ctx, src, prefix)
	if err != nil {
		return 0, fmt.Errorf("source leases: %w", err)
	}
	b, err := leases(ctx, dst, prefix)
	if err != nil {
		return 0, fmt.Errorf("target leases: %w", err)
	}
	if fmt.Sprint(a) != fmt.Sprint(b) {
		return 0, fmt.Errorf("leases differ:\nsource %v\ntarget %v", a, b)
	}
	return len(a), nil
}

// compareAll checks the target against the source over [from, to]: the
// watch replay from `from` with prev_kv, Range at every revision, HashKV
// at `to` (whole keyspace only) and the leases.
//
// want, when not nil, is what a watcher of the source received over [from,
// to]; otherwise the source's own replay is compared.
func compareAll(t testing.TB, ctx context.Context, src, dst *clientv3.Client, prefix string, from, to int64, want []event) {
	t.Helper()
	compareSome(t, ctx, src, dst, prefix, from, to, 1, want)
}

// compareSome is compareAll with Range compared only at every step-th
// revision (and at `to`): the watch replay with prev_kv and HashKV already
// cover every version in between.
func compareSome(t testing.TB, ctx context.Context, src, dst *clientv3.Client, prefix string, from, to, step int64, want []event) {
	t.Helper()
	start := time.Now()
	if want == nil {
		var err error
		if want, err = collectWatch(ctx, src, prefix, from, to); err != nil {
			t.Fatalf("source replay: %v", err)
		}
	}
	got, err := collectWatch(ctx, dst, prefix, from, to)
	if err != nil {
		t.Fatalf("target replay: %v", err)
	}
	if err := diffEvents(want, got); err != nil {
		t.Errorf("watch replay from %d: %v", from, err)
	}
	if err := compareRanges(ctx, src, dst, prefix, from, to, step); err != nil {
		t.Errorf("ranges: %v", err)
	}
	if prefix == "" {
		hs, cs, err := hashKV(ctx, src, to)
		if err != nil {
			t.Fatalf("source HashKV: %v", err)
		}
		ht, ct, err := hashKV(ctx, dst, to)
		if err != nil {
			t.Fatalf("target HashKV: %v", err)
		}
		if hs != ht || cs != ct {
			t.Errorf("HashKV at %d: source %d (compacted %d), target %d (compacted %d)", to, hs, cs, ht, ct)
		}
	}
	n, err := compareLeases(ctx, src, dst, prefix)
	if err != nil {
		t.Error(err)
	}
	t.Logf("compared revisions %d..%d: %d events, ranges at every %d revisions, %d leases, in %v", from, to, len(want), step, n, time.Since(start).Round(time.Millisecond))
}

// contains reports whether s contains every one of subs.
func contains(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}
