package kvtest_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvtest"
)

// bugs switches on one defect each in the naive store, to prove that the
// suite notices it. A suite that passes a broken adaptor is worse than none.
type bugs struct {
	noSnapshot       bool // iterators read the live map
	ignoreConditions bool // conditional ops always succeed
	lastConflict     bool // conflict names the last failing op
	partialApply     bool // ops before the failing condition are applied
	emptyIsAbsent    bool // Get treats an empty value as absent
	signedOrder      bool // keys compared as signed bytes
	reverseHasEnd    bool // reverse scans include End itself
	ignoreLimit      bool // Limit is ignored
	sharedGet        bool // Get returns the stored slice
	noClosedErr      bool // calls after Close succeed
	allowDuplicates  bool // ValidateBatch is skipped
	racyConditions   bool // conditions checked outside the write lock
	stickyBatches    bool // an exhausted iterator starts over
	wrongPartitions  bool // partitions leave a gap
	shrinkingSize    bool // Size shrinks as keys are written
	reclaimLoses     bool // Reclaim drops the first live key
}

// naive is a deliberately simple kv.Store: a map under a lock, and scans
// that copy their range. Obviously correct when no bug is switched on.
type naive struct {
	mu     sync.RWMutex
	m      map[string][]byte
	closed bool
	bug    bugs
	// version counts applied batches, so that a non-snapshot iterator can
	// cache the live range while nothing changes and stay fast.
	version int
}

func newNaive(b bugs) *naive { return &naive{m: map[string][]byte{}, bug: b} }

func (n *naive) less(a, b []byte) bool {
	if n.bug.signedOrder {
		for i := 0; i < len(a) && i < len(b); i++ {
			if a[i] != b[i] {
				return int8(a[i]) < int8(b[i])
			}
		}
		return len(a) < len(b)
	}
	return bytes.Compare(a, b) < 0
}

func (n *naive) Features() kv.Features { return kv.Features{Name: "naive"} }

func (n *naive) Get(_ context.Context, key []byte) ([]byte, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.closed && !n.bug.noClosedErr {
		return nil, kv.ErrClosed
	}
	v, ok := n.m[string(key)]
	if !ok || (n.bug.emptyIsAbsent && len(v) == 0) {
		return nil, kv.ErrNotFound
	}
	if n.bug.sharedGet {
		return v, nil
	}
	return bytes.Clone(v), nil
}

func (n *naive) check(ops []kv.Op) error {
	var conflict error
	for i, op := range ops {
		if !op.Kind.Conditional() {
			continue
		}
		cur, exists := n.m[string(op.Key)]
		ok := !exists
		if op.Kind != kv.OpPutIfAbsent {
			ok = exists && bytes.Equal(cur, op.Expected)
		}
		if !ok && !n.bug.ignoreConditions {
			conflict = &kv.ConflictError{Index: i, Key: bytes.Clone(op.Key), Exists: exists, Current: bytes.Clone(cur)}
			if !n.bug.lastConflict {
				return conflict
			}
		}
	}
	return conflict
}

func (n *naive) Commit(_ context.Context, ops []kv.Op) error {
	if !n.bug.allowDuplicates {
		if err := kv.ValidateBatch(ops); err != nil {
			return err
		}
	}
	if n.bug.racyConditions {
		n.mu.RLock()
		err := n.check(ops)
		n.mu.RUnlock()
		if err != nil {
			return err
		}
		runtime.Gosched()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed && !n.bug.noClosedErr {
		return kv.ErrClosed
	}
	if !n.bug.racyConditions {
		if err := n.check(ops); err != nil {
			if n.bug.partialApply {
				n.apply(ops[:err.(*kv.ConflictError).Index])
			}
			return err
		}
	}
	n.apply(ops)
	return nil
}

func (n *naive) apply(ops []kv.Op) {
	n.version++
	for _, op := range ops {
		switch op.Kind {
		case kv.OpDelete, kv.OpCompareAndDelete:
			delete(n.m, string(op.Key))
		default:
			n.m[string(op.Key)] = bytes.Clone(op.Value)
			if n.m[string(op.Key)] == nil {
				n.m[string(op.Key)] = []byte{}
			}
		}
	}
}

// rangeLocked returns the pairs of [start, end) in order; n.mu is held.
func (n *naive) rangeLocked(o kv.ScanOptions) []kv.Pair {
	var out []kv.Pair
	for k, v := range n.m {
		kb := []byte(k)
		if n.less(kb, o.Start) {
			continue
		}
		if len(o.End) > 0 && !n.less(kb, o.End) && !(n.bug.reverseHasEnd && o.Reverse && bytes.Equal(kb, o.End)) {
			continue
		}
		out = append(out, kv.Pair{Key: kb, Value: bytes.Clone(v)})
	}
	sort.Slice(out, func(i, j int) bool { return n.less(out[i].Key, out[j].Key) })
	if o.Reverse {
		slices.Reverse(out)
	}
	if o.Limit > 0 && len(out) > o.Limit && !n.bug.ignoreLimit {
		out = out[:o.Limit]
	}
	return out
}

func (n *naive) Scan(_ context.Context, o kv.ScanOptions) (kv.Iterator, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.closed && !n.bug.noClosedErr {
		return nil, kv.ErrClosed
	}
	o.Start, o.End = bytes.Clone(o.Start), bytes.Clone(o.End)
	it := &naiveIter{n: n, opts: o}
	if !n.bug.noSnapshot {
		it.pairs = n.rangeLocked(o)
	}
	return it, nil
}

func (n *naive) Partitions(_ context.Context, start, end []byte) ([]kv.Range, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.closed && !n.bug.noClosedErr {
		return nil, kv.ErrClosed
	}
	if n.bug.wrongPartitions {
		return []kv.Range{{Start: start, End: []byte("p/1")}, {Start: []byte("p/2"), End: end}}, nil
	}
	return []kv.Range{{Start: start, End: end}}, nil
}

// Size is the bytes of the keys and values held.
func (n *naive) Size() (int64, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	var size int64
	for k, v := range n.m {
		size += int64(len(k) + len(v))
	}
	if n.bug.shrinkingSize {
		size = -size
	}
	return size, nil
}

// Reclaim has nothing to reclaim in a map.
func (n *naive) Reclaim(ctx context.Context) error {
	if n.bug.reclaimLoses {
		n.mu.Lock()
		first := ""
		for k := range n.m {
			if first == "" || k < first {
				first = k
			}
		}
		delete(n.m, first)
		n.version++
		n.mu.Unlock()
	}
	return ctx.Err()
}

func (n *naive) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	return nil
}

type naiveIter struct {
	n     *naive
	opts  kv.ScanOptions
	pairs []kv.Pair // the snapshot, unless noSnapshot
	pos   int
	last  []byte // last key yielded, for noSnapshot
	live  []kv.Pair
	seen  int // version of live
}

func (it *naiveIter) Next(context.Context) ([]kv.Pair, error) {
	it.n.mu.RLock()
	defer it.n.mu.RUnlock()
	if it.n.closed && !it.n.bug.noClosedErr {
		return nil, kv.ErrClosed
	}
	bs := it.opts.BatchSize
	if bs <= 0 {
		bs = 100
	}
	if it.n.bug.noSnapshot {
		if it.live == nil || it.seen != it.n.version {
			// Re-read the live range and resume after the last key yielded.
			o := it.opts
			o.Limit = 0
			it.live, it.seen = nil, it.n.version
			for _, p := range it.n.rangeLocked(o) {
				if it.last == nil || (!o.Reverse && it.n.less(it.last, p.Key)) || (o.Reverse && it.n.less(p.Key, it.last)) {
					it.live = append(it.live, p)
				}
			}
			if it.live == nil {
				it.live = []kv.Pair{}
			}
		}
		n := min(bs, len(it.live))
		if it.opts.Limit > 0 {
			n = min(n, it.opts.Limit-it.pos)
		}
		out := it.live[:n]
		it.live = it.live[n:]
		it.pos += n
		if n > 0 {
			it.last = out[n-1].Key
		}
		return out, nil
	}
	if it.pos >= len(it.pairs) && it.n.bug.stickyBatches {
		it.pos = 0
	}
	out := it.pairs[it.pos:min(it.pos+bs, len(it.pairs))]
	it.pos += len(out)
	return out, nil
}

func (it *naiveIter) Close() error { return nil }

// runNaive runs the named cases, or all of them, against a naive store.
func runNaive(t *testing.T, b bugs, names ...string) []kvtest.Result {
	t.Helper()
	cfg := kvtest.Config{MaxValueSize: 1 << 21, CaseTimeout: 20 * time.Second}
	cases := kvtest.Cases(cfg)
	if len(names) > 0 {
		cases = slices.DeleteFunc(cases, func(c kvtest.Case) bool { return !slices.Contains(names, c.Name) })
		if len(cases) != len(names) {
			t.Fatalf("unknown case among %v", names)
		}
	}
	return kvtest.VerifyCases(t.Context(), cfg, cases, func(context.Context) (kv.Store, error) { return newNaive(b), nil })
}

func TestNaiveStorePasses(t *testing.T) {
	kvtest.RunConfig(t, kvtest.Config{MaxValueSize: 1 << 21}, func(*testing.T) kv.Store { return newNaive(bugs{}) })
}

func TestVerifyReportsPass(t *testing.T) {
	for _, r := range runNaive(t, bugs{}) {
		if !r.Passed {
			t.Errorf("%s failed on a correct store: %s", r.Name, strings.Join(r.Messages, "\n"))
		}
	}
}

func TestSuiteCatchesBugs(t *testing.T) {
	for name, c := range map[string]struct {
		bug  bugs
		want []string // cases that must fail
	}{
		"noSnapshot":       {bugs{noSnapshot: true}, []string{"SnapshotIsolation"}},
		"ignoreConditions": {bugs{ignoreConditions: true}, []string{"ConditionalConflicts", "BatchAtomicity", "ConcurrentPutIfAbsent"}},
		"lastConflict":     {bugs{lastConflict: true}, []string{"ConditionalConflicts"}},
		"partialApply":     {bugs{partialApply: true}, []string{"BatchAtomicity"}},
		"emptyIsAbsent":    {bugs{emptyIsAbsent: true}, []string{"EmptyValues"}},
		"signedOrder":      {bugs{signedOrder: true}, []string{"ByteOrder"}},
		"reverseHasEnd":    {bugs{reverseHasEnd: true}, []string{"ScanBoundsAndLimits", "EmptyRanges"}},
		"ignoreLimit":      {bugs{ignoreLimit: true}, []string{"ScanBoundsAndLimits", "MultiBatchScan"}},
		"sharedGet":        {bugs{sharedGet: true}, []string{"CopySemantics"}},
		"noClosedErr":      {bugs{noClosedErr: true}, []string{"Close"}},
		"allowDuplicates":  {bugs{allowDuplicates: true}, []string{"InvalidBatches"}},
		"racyConditions":   {bugs{racyConditions: true}, []string{"ConcurrentCASCounter"}},
		"stickyBatches":    {bugs{stickyBatches: true}, []string{"ByteOrder", "MultiBatchScan"}},
		"wrongPartitions":  {bugs{wrongPartitions: true}, []string{"Partitions"}},
		"shrinkingSize":    {bugs{shrinkingSize: true}, []string{"Size"}},
		"reclaimLoses":     {bugs{reclaimLoses: true}, []string{"Reclaim"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			failed := map[string]bool{}
			for _, r := range runNaive(t, c.bug, c.want...) {
				failed[r.Name] = !r.Passed
				if r.Duration > 2*time.Second {
					t.Logf("%s took %v with bug %s", r.Name, r.Duration, name)
				}
			}
			for _, w := range c.want {
				if !failed[w] {
					t.Errorf("case %s passed on a store with bug %s", w, name)
				}
			}
		})
	}
}

func TestVerifySurvivesPanicsAndOpenErrors(t *testing.T) {
	res := kvtest.Verify(t.Context(), kvtest.Config{}, func(context.Context) (kv.Store, error) {
		return nil, errors.New("no engine")
	})
	for _, r := range res {
		if r.Passed || len(r.Messages) == 0 {
			t.Errorf("%s: passed=%v messages=%q with a store that cannot open", r.Name, r.Passed, r.Messages)
		}
	}
	res = kvtest.Verify(t.Context(), kvtest.Config{}, func(context.Context) (kv.Store, error) { return panicky{}, nil })
	for _, r := range res {
		if r.Passed && !r.Skipped && r.Name != "Features" {
			t.Errorf("%s passed on a store that panics", r.Name)
		}
	}
}

// TestVerifySkipsOptionalInterfaces: a store that is neither a kv.Sizer
// nor a kv.Reclaimer passes their cases as skipped, saying why, while the
// naive store, which is both, runs them.
func TestVerifySkipsOptionalInterfaces(t *testing.T) {
	names := []string{"Size", "Reclaim"}
	var cases []kvtest.Case
	for _, c := range kvtest.Cases(kvtest.Config{}) {
		if slices.Contains(names, c.Name) {
			cases = append(cases, c)
		}
	}
	plain := kvtest.VerifyCases(t.Context(), kvtest.Config{}, cases, func(context.Context) (kv.Store, error) {
		return plainStore{newNaive(bugs{})}, nil
	})
	full := kvtest.VerifyCases(t.Context(), kvtest.Config{}, cases, func(context.Context) (kv.Store, error) {
		return newNaive(bugs{}), nil
	})
	for i := range cases {
		if r := plain[i]; !r.Passed || !r.Skipped || len(r.Messages) == 0 {
			t.Errorf("%s on a plain store: passed=%v skipped=%v messages=%q, want a skip saying why", r.Name, r.Passed, r.Skipped, r.Messages)
		}
		if r := full[i]; !r.Passed || r.Skipped {
			t.Errorf("%s on the naive store: passed=%v skipped=%v messages=%q, want it run and passed", r.Name, r.Passed, r.Skipped, r.Messages)
		}
	}
}

// plainStore hides the naive store's optional interfaces.
type plainStore struct{ kv.Store }

// panicky is an adaptor that panics on every call but Features.
type panicky struct{ kv.Store }

func (panicky) Features() kv.Features { return kv.Features{Name: "panicky"} }
func (panicky) Close() error          { return nil }
