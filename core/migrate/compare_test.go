package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// event is a watch event as both sides must deliver it.
type event struct {
	typ  mvccpb.Event_EventType
	kv   *mvccpb.KeyValue
	prev *mvccpb.KeyValue
}

func toEvent(ev *clientv3.Event) event {
	e := event{typ: ev.Type, kv: kvCopy(ev.Kv)}
	if ev.PrevKv != nil {
		e.prev = kvCopy(ev.PrevKv)
	}
	return e
}

func kvCopy(kv *mvccpb.KeyValue) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: kv.Key, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version, Value: kv.Value, Lease: kv.Lease}
}

func kvString(kv *mvccpb.KeyValue) string {
	if kv == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%q=%q create %d mod %d version %d lease %x", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease)
}

func (e event) String() string {
	return fmt.Sprintf("%s %s prev %s", e.typ, kvString(e.kv), kvString(e.prev))
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
			// A progress request is answered only once the watch has
			// caught up, so it is asked again at a pace until then.
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
