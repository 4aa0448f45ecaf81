package kvtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/engramkv/engram/core/kv"
)

// maxNextCalls bounds how often scanAll calls Next, so that an iterator
// which never reports exhaustion fails the case instead of hanging it.
const maxNextCalls = 1 << 20

// show renders a key or value for a failure message: short ones verbatim,
// long ones by length and a prefix, so a 4 MiB value does not flood the log.
func show(b []byte) string {
	if b == nil {
		return "<nil>"
	}
	if len(b) <= 40 {
		return fmt.Sprintf("%q", b)
	}
	return fmt.Sprintf("%q...(%d bytes)", b[:24], len(b))
}

func showPairs(ps []kv.Pair) string {
	var sb strings.Builder
	sb.WriteByte('[')
	for i, p := range ps {
		if i > 0 {
			sb.WriteString(", ")
		}
		if i == 8 && len(ps) > 10 {
			fmt.Fprintf(&sb, "... %d more", len(ps)-i)
			break
		}
		sb.WriteString(show(p.Key))
		sb.WriteByte('=')
		sb.WriteString(show(p.Value))
	}
	sb.WriteByte(']')
	return sb.String()
}

func showOpts(o kv.ScanOptions) string {
	return fmt.Sprintf("{Start:%s End:%s Reverse:%v Limit:%d BatchSize:%d}",
		show(o.Start), show(o.End), o.Reverse, o.Limit, o.BatchSize)
}

func mustCommit(ctx context.Context, t T, s kv.Store, ops ...kv.Op) {
	t.Helper()
	if err := s.Commit(ctx, ops); err != nil {
		t.Fatalf("Commit of %d ops (first key %s): %v", len(ops), show(ops[0].Key), err)
	}
}

// lookup returns the value of key and whether it exists; any error other
// than ErrNotFound is fatal.
func lookup(ctx context.Context, t T, s kv.Store, key []byte) ([]byte, bool) {
	t.Helper()
	v, err := s.Get(ctx, key)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, false
	}
	if err != nil {
		t.Fatalf("Get(%s): %v", show(key), err)
	}
	return v, true
}

func expectValue(ctx context.Context, t T, s kv.Store, key, want []byte) {
	t.Helper()
	got, ok := lookup(ctx, t, s, key)
	if !ok {
		t.Errorf("Get(%s): ErrNotFound, want %s", show(key), show(want))
		return
	}
	if !bytes.Equal(got, want) {
		t.Errorf("Get(%s) = %s, want %s", show(key), show(got), show(want))
	}
}

func expectAbsent(ctx context.Context, t T, s kv.Store, key []byte) {
	t.Helper()
	if got, ok := lookup(ctx, t, s, key); ok {
		t.Errorf("Get(%s) = %s, want ErrNotFound", show(key), show(got))
	}
}

// scanAll drains one Scan and checks the iterator protocol on the way: keys
// in the requested order, within bounds, within Limit, and an exhausted
// iterator that stays exhausted.
func scanAll(ctx context.Context, t T, s kv.Store, opts kv.ScanOptions) []kv.Pair {
	t.Helper()
	it, err := s.Scan(ctx, opts)
	if err != nil {
		t.Fatalf("Scan%s: %v", showOpts(opts), err)
	}
	defer func() {
		if err := it.Close(); err != nil {
			t.Errorf("Iterator.Close: %v", err)
		}
	}()
	out, err := drain(ctx, it, opts)
	if err != nil {
		t.Fatalf("Scan%s: %v", showOpts(opts), err)
	}
	return out
}

// drain is scanAll's engine; it reports protocol violations as errors so
// that helper goroutines, which must not call Fatalf, can use it too.
func drain(ctx context.Context, it kv.Iterator, opts kv.ScanOptions) ([]kv.Pair, error) {
	var out []kv.Pair
	for calls := 0; ; calls++ {
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("after %d pairs: %w", len(out), err)
		}
		if calls > maxNextCalls {
			return out, fmt.Errorf("iterator still not exhausted after %d Next calls", calls)
		}
		batch, err := it.Next(ctx)
		if err != nil {
			return out, fmt.Errorf("Next after %d pairs: %w", len(out), err)
		}
		if len(batch) == 0 {
			break
		}
		for _, p := range batch {
			if err := checkPair(out, p, opts); err != nil {
				return out, err
			}
			out = append(out, p)
		}
	}
	// Exhaustion must be sticky: the core may call Next again after an
	// empty batch (e.g. when it merges several iterators).
	batch, err := it.Next(ctx)
	if err != nil || len(batch) != 0 {
		return out, fmt.Errorf("Next after exhaustion = %d pairs, %v; want 0 pairs, nil", len(batch), err)
	}
	return out, nil
}

func checkPair(prev []kv.Pair, p kv.Pair, opts kv.ScanOptions) error {
	if opts.Limit > 0 && len(prev) >= opts.Limit {
		return fmt.Errorf("iterator yielded more than Limit=%d pairs (extra key %s)", opts.Limit, show(p.Key))
	}
	if !inRange(p.Key, opts.Start, opts.End) {
		return fmt.Errorf("key %s outside [%s, %s)", show(p.Key), show(opts.Start), show(opts.End))
	}
	if len(prev) > 0 {
		last := prev[len(prev)-1].Key
		c := bytes.Compare(last, p.Key)
		if (!opts.Reverse && c >= 0) || (opts.Reverse && c <= 0) {
			return fmt.Errorf("key %s after %s breaks %s order", show(p.Key), show(last), dir(opts.Reverse))
		}
	}
	return nil
}

func dir(reverse bool) string {
	if reverse {
		return "descending"
	}
	return "ascending"
}

func inRange(k, start, end []byte) bool {
	return bytes.Compare(k, start) >= 0 && (len(end) == 0 || bytes.Compare(k, end) < 0)
}

func expectScan(ctx context.Context, t T, s kv.Store, opts kv.ScanOptions, want []kv.Pair) {
	t.Helper()
	got := scanAll(ctx, t, s, opts)
	if diff := diffPairs(got, want); diff != "" {
		t.Errorf("Scan%s: %s\n got: %s\nwant: %s", showOpts(opts), diff, showPairs(got), showPairs(want))
	}
}

// diffPairs returns "" when the sequences are equal, else the first
// difference.
func diffPairs(got, want []kv.Pair) string {
	for i := 0; i < len(got) && i < len(want); i++ {
		if !bytes.Equal(got[i].Key, want[i].Key) {
			return fmt.Sprintf("pair %d: key %s, want %s", i, show(got[i].Key), show(want[i].Key))
		}
		if !bytes.Equal(got[i].Value, want[i].Value) {
			return fmt.Sprintf("pair %d (key %s): value %s, want %s", i, show(got[i].Key), show(got[i].Value), show(want[i].Value))
		}
	}
	if len(got) != len(want) {
		return fmt.Sprintf("%d pairs, want %d", len(got), len(want))
	}
	return ""
}

func expectConflict(t T, err error, index int, key []byte, exists bool, current []byte) {
	t.Helper()
	ce, ok := kv.AsConflict(err)
	if !ok {
		t.Errorf("Commit error = %v, want *kv.ConflictError on op %d", err, index)
		return
	}
	if ce.Index != index {
		t.Errorf("ConflictError.Index = %d, want %d", ce.Index, index)
	}
	if !bytes.Equal(ce.Key, key) {
		t.Errorf("ConflictError.Key = %s, want %s", show(ce.Key), show(key))
	}
	if ce.Exists != exists {
		t.Errorf("ConflictError.Exists = %v, want %v (key %s)", ce.Exists, exists, show(key))
	}
	if exists && !bytes.Equal(ce.Current, current) {
		t.Errorf("ConflictError.Current = %s, want %s", show(ce.Current), show(current))
	}
	if !exists && len(ce.Current) != 0 {
		t.Errorf("ConflictError.Current = %s for an absent key, want empty", show(ce.Current))
	}
}

// model is the reference the cases compare adaptors against: a map plus a
// sort, obviously correct and slow.
type model map[string][]byte

func (m model) apply(ops ...kv.Op) {
	for _, op := range ops {
		switch op.Kind {
		case kv.OpPut, kv.OpPutIfAbsent, kv.OpCompareAndSwap:
			m[string(op.Key)] = append([]byte{}, op.Value...)
		case kv.OpDelete, kv.OpCompareAndDelete:
			delete(m, string(op.Key))
		}
	}
}

func (m model) scan(opts kv.ScanOptions) []kv.Pair {
	var out []kv.Pair
	for k, v := range m {
		if inRange([]byte(k), opts.Start, opts.End) {
			out = append(out, kv.Pair{Key: []byte(k), Value: v})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		c := bytes.Compare(out[i].Key, out[j].Key)
		if opts.Reverse {
			return c > 0
		}
		return c < 0
	})
	if opts.Limit > 0 && len(out) > opts.Limit {
		out = out[:opts.Limit]
	}
	return out
}

// load writes m into s in batches of at most n ops.
func load(ctx context.Context, t T, s kv.Store, m model, n int) {
	t.Helper()
	all := m.scan(kv.ScanOptions{})
	for len(all) > 0 {
		k := min(n, len(all))
		ops := make([]kv.Op, k)
		for i, p := range all[:k] {
			ops[i] = kv.Put(p.Key, p.Value)
		}
		mustCommit(ctx, t, s, ops...)
		all = all[k:]
	}
}

func key(format string, args ...any) []byte { return []byte(fmt.Sprintf(format, args...)) }

// spawn runs f on a new goroutine tracked by wg. A panic in f becomes a
// reported failure: a panicking adaptor must fail the case, not take the
// whole verifier process down, which recover in the runner cannot prevent
// for goroutines it did not start.
func spawn(t T, wg *sync.WaitGroup, f func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("panic in helper goroutine: %v", p)
			}
		}()
		f()
	}()
}
