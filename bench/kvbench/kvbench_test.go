package kvbench

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/memkv"
)

func small() Config {
	c := Defaults()
	c.Keys = 300
	c.Duration = 50 * time.Millisecond
	c.LoadBatch = 64
	return c
}

func count(t *testing.T, st kv.Store) int {
	t.Helper()
	it, err := st.Scan(context.Background(), kv.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for {
		b, err := it.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(b) == 0 {
			return n
		}
		n += len(b)
	}
}

func TestRunMeasuresEveryOperation(t *testing.T) {
	for _, clients := range []int{1, 3} {
		st := memkv.New()
		cfg := small()
		cfg.Clients = clients
		res, err := Run(context.Background(), st, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != len(Ops) {
			t.Fatalf("%d results, want one per op %v", len(res), Ops)
		}
		for i, r := range res {
			if r.Op != Ops[i] || r.Calls == 0 || r.Errors != 0 || r.PerSecond <= 0 ||
				r.P50 <= 0 || r.P99 < r.P50 || r.Mean <= 0 {
				t.Errorf("clients=%d: result %+v", clients, r)
			}
		}
		// Every commit created one key; cleanup removes them all.
		if n := count(t, st); n <= cfg.Keys {
			t.Errorf("clients=%d: %d keys after the run, want more than the %d loaded", clients, n, cfg.Keys)
		}
		if err := Cleanup(context.Background(), st, 50); err != nil {
			t.Fatal(err)
		}
		if n := count(t, st); n != 0 {
			t.Errorf("clients=%d: %d keys left after Cleanup", clients, n)
		}
	}
}

func TestRunSizes(t *testing.T) {
	st := memkv.New()
	cfg := small()
	cfg.KeySize, cfg.ValueSize = 33, 7
	if _, err := Run(context.Background(), st, cfg, []string{OpGet}); err != nil {
		t.Fatal(err)
	}
	it, err := st.Scan(context.Background(), kv.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	b, err := it.Next(context.Background())
	if err != nil || len(b) == 0 {
		t.Fatalf("scan: %d pairs, %v", len(b), err)
	}
	for _, p := range b {
		if len(p.Key) != 33 || len(p.Value) != 7 {
			t.Fatalf("pair of %d/%d bytes, want 33/7", len(p.Key), len(p.Value))
		}
	}
}

// flaky fails every other Get and, once armed, loses the next Put of a
// key: what a broken adaptor does.
type flaky struct {
	kv.Store
	mu    sync.Mutex
	gets  int
	lose  bool
	alter []byte
}

func (f *flaky) Get(ctx context.Context, key []byte) ([]byte, error) {
	f.mu.Lock()
	f.gets++
	odd := f.gets%2 == 1
	f.mu.Unlock()
	if odd {
		return nil, errors.New("engine on fire")
	}
	return f.Store.Get(ctx, key)
}

func (f *flaky) Commit(ctx context.Context, ops []kv.Op) error {
	if f.lose && len(ops) > 0 && ops[0].Kind == kv.OpCompareAndSwap {
		// Overwrite the swapped key behind the bench's back, so its next
		// CompareAndSwap finds a value it never wrote.
		f.alter = append(f.alter[:0], ops[0].Key...)
		if err := f.Store.Commit(ctx, ops); err != nil {
			return err
		}
		return f.Store.Commit(ctx, []kv.Op{kv.Put(f.alter, []byte("lost"))})
	}
	return f.Store.Commit(ctx, ops)
}

func TestRunReportsFailedCalls(t *testing.T) {
	st := &flaky{Store: memkv.New()}
	cfg := small()
	cfg.Keys = 2 // every commit swaps the same key
	cfg.Clients = 1
	res, err := Run(context.Background(), st, cfg, []string{OpGet})
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; r.Errors == 0 || r.Calls == 0 || !strings.Contains(r.FirstError, "engine on fire") {
		t.Errorf("get on a store failing half the calls: %+v", r)
	}

	st.lose = true
	res, err = Run(context.Background(), st, cfg, []string{OpCommit})
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; r.Errors == 0 || !strings.Contains(r.FirstError, "does not hold the value it acknowledged") {
		t.Errorf("commit on a store that loses writes: %+v", r)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		change func(*Config)
		want   string
	}{
		{func(c *Config) { c.Keys = 0 }, "keys"},
		{func(c *Config) { c.KeySize = 8 }, "key size"},
		{func(c *Config) { c.ValueSize = 5 << 20 }, "value size"},
		{func(c *Config) { c.ScanLength = 0 }, "scan length"},
		{func(c *Config) { c.Duration = 0 }, "duration"},
		{func(c *Config) { c.Clients = 0 }, "clients"},
		{func(c *Config) { c.LoadBatch = 0 }, "load batch"},
	} {
		c := Defaults()
		tc.change(&c)
		if _, err := Run(context.Background(), memkv.New(), c, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %+v: err %v, want one naming %q", c, err, tc.want)
		}
	}
	if _, err := Run(context.Background(), memkv.New(), small(), []string{"put"}); err == nil || !strings.Contains(err.Error(), `"put"`) {
		t.Errorf("unknown op: err %v", err)
	}
}
