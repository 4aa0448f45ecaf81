// Package kvbench measures what one call to a storage adaptor costs: Get,
// Scan and Commit against a kv.Store, with latency percentiles in
// nanoseconds and throughput. `engram plugin bench` runs it on a .wasm
// plugin through the host and on the native memkv beside it, so a storage
// team sees what its adaptor adds before deploying it.
//
// It measures at the kv.Store interface, the boundary the core calls: for a
// plugin that includes encoding the request, the call into wasm, the
// plugin's own work (and its round trips to a remote database) and decoding
// the answer. It must not know which store it measures, must not start
// anything, and must not report an operation that failed as a latency: the
// caller gets the error count and the first error beside the numbers.
//
// Keys are random names of a fixed size, preloaded in random order and
// chosen at random, as kube-apiserver's object names arrive: sequential keys
// would flatter every ordered engine's caches.
package kvbench

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/engramkv/engram/core/kv"
)

// The operations Run measures, in this order.
const (
	// OpGet reads one existing key.
	OpGet = "get"
	// OpScan reads ScanLength pairs from a random existing key onwards,
	// opening and closing one scan: a page of a list.
	OpScan = "scan"
	// OpCommit applies three ops atomically, the shape of one of Engram's
	// writes: a CompareAndSwap of an existing key, a PutIfAbsent of a new
	// key and a Put.
	OpCommit = "commit"
)

// Ops is every operation, in the order Run measures them.
var Ops = []string{OpGet, OpScan, OpCommit}

// Config shapes a run.
type Config struct {
	// Keys is how many keys are loaded before measuring.
	Keys int
	// KeySize and ValueSize are the sizes in bytes of every key and value.
	KeySize, ValueSize int
	// ScanLength is the pairs one scan reads.
	ScanLength int
	// Duration is how long each operation is measured.
	Duration time.Duration
	// Clients are concurrent callers. One measures the cost of a call; a
	// pooled plugin can serve up to its pool size at once.
	Clients int
	// LoadBatch is the puts per commit while loading; keep it within the
	// adaptor's commit limits.
	LoadBatch int
	// Seed makes the key names repeatable, so two stores get the same data.
	Seed uint64
}

// Defaults are kube-apiserver-like sizes: 70-byte keys (Engram's internal
// keys for /registry/pods/<namespace>/<name> are about this long) and
// 512-byte values, the object size `engram bench` uses.
func Defaults() Config {
	return Config{Keys: 10_000, KeySize: 70, ValueSize: 512, ScanLength: 100,
		Duration: 2 * time.Second, Clients: 1, LoadBatch: 100, Seed: 1}
}

// Validate names the first unusable field.
func (c Config) Validate() error {
	switch {
	case c.Keys < 1:
		return fmt.Errorf("keys must be at least 1, got %d", c.Keys)
	case c.KeySize < 16 || c.KeySize > 60_000:
		return fmt.Errorf("key size must be between 16 and 60000 bytes, got %d", c.KeySize)
	case c.ValueSize < 0 || c.ValueSize > 4<<20:
		return fmt.Errorf("value size must be between 0 and 4 MiB, got %d", c.ValueSize)
	case c.ScanLength < 1:
		return fmt.Errorf("scan length must be at least 1, got %d", c.ScanLength)
	case c.Duration <= 0:
		return fmt.Errorf("duration must be positive, got %s", c.Duration)
	case c.Clients < 1:
		return fmt.Errorf("clients must be at least 1, got %d", c.Clients)
	case c.LoadBatch < 1:
		return fmt.Errorf("load batch must be at least 1, got %d", c.LoadBatch)
	}
	return nil
}

// Result is one operation's measurement on one store.
type Result struct {
	Op string `json:"op"`
	// Calls is the operations completed without error.
	Calls int64 `json:"calls"`
	// PerSecond is Calls over the measured time, all clients together.
	PerSecond float64 `json:"per_second"`
	// P50, P99 and Mean are the latencies of the successful calls.
	P50  time.Duration `json:"p50_ns"`
	P99  time.Duration `json:"p99_ns"`
	Mean time.Duration `json:"mean_ns"`
	// Errors is the calls that failed; FirstError is one of them.
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
}

// Run loads cfg.Keys keys into st (which should be empty) and measures each
// of ops (Ops when empty) for cfg.Duration. It returns an error when the
// load fails or ctx ends; failed calls during a measurement are counted in
// the Result instead.
func Run(ctx context.Context, st kv.Store, cfg Config, ops []string) ([]Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(ops) == 0 {
		ops = Ops
	}
	for _, op := range ops {
		if op != OpGet && op != OpScan && op != OpCommit {
			return nil, fmt.Errorf("unknown operation %q (want %s, %s or %s)", op, OpGet, OpScan, OpCommit)
		}
	}
	d := newDataset(cfg)
	if err := d.load(ctx, st); err != nil {
		return nil, fmt.Errorf("loading %d keys: %w", cfg.Keys, err)
	}
	var out []Result
	for _, op := range ops {
		r, err := d.measure(ctx, st, op)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// dataset is the keys of a run and their current values. Each client owns
// the keys whose index is its number modulo Clients, so a client's
// CompareAndSwap always knows the value it expects.
type dataset struct {
	cfg    Config
	keys   [][]byte
	values [][]byte // current value of keys[i]
	fresh  uint64   // names of keys created by commits
	mu     sync.Mutex
}

func newDataset(cfg Config) *dataset {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6b7662656e6368)) // "kvbench"
	d := &dataset{cfg: cfg, keys: make([][]byte, cfg.Keys), values: make([][]byte, cfg.Keys)}
	for i := range d.keys {
		d.keys[i] = randomName(rng, cfg.KeySize)
		d.values[i] = randomValue(rng, cfg.ValueSize)
	}
	return d
}

// randomName is a printable random key of n bytes under a fixed prefix, so
// a scan from any key has keys after it.
func randomName(rng *rand.Rand, n int) []byte {
	const prefix = "/kvbench/"
	raw := make([]byte, (n-len(prefix)+1)/2)
	for i := range raw {
		raw[i] = byte(rng.Uint32())
	}
	return append([]byte(prefix), hex.EncodeToString(raw)[:n-len(prefix)]...)
}

func randomValue(rng *rand.Rand, n int) []byte {
	v := make([]byte, n)
	for i := range v {
		v[i] = byte(rng.Uint32())
	}
	return v
}

// load writes every key in batches, in the order the names were drawn.
func (d *dataset) load(ctx context.Context, st kv.Store) error {
	batch := make([]kv.Op, 0, d.cfg.LoadBatch)
	for i := range d.keys {
		batch = append(batch, kv.Put(d.keys[i], d.values[i]))
		if len(batch) == cap(batch) || i == len(d.keys)-1 {
			if err := st.Commit(ctx, batch); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	return nil
}

// histogram range: 100 ns to 60 s at three significant digits.
const (
	minNanos = 100
	maxNanos = int64(60 * time.Second)
)

// measure runs op from cfg.Clients goroutines for cfg.Duration.
func (d *dataset) measure(ctx context.Context, st kv.Store, op string) (Result, error) {
	type client struct {
		h      *hdrhistogram.Histogram
		errs   int64
		first  error
		calls  int64
		rng    *rand.Rand
		number int
		values [][]byte // new values for commits, drawn before timing
	}
	clients := make([]*client, d.cfg.Clients)
	for i := range clients {
		rng := rand.New(rand.NewPCG(d.cfg.Seed+uint64(i)+1, uint64(len(op))))
		c := &client{h: hdrhistogram.New(minNanos, maxNanos, 3), rng: rng, number: i}
		if op == OpCommit {
			for range commitValues {
				c.values = append(c.values, randomValue(rng, d.cfg.ValueSize))
			}
		}
		clients[i] = c
	}
	start := time.Now()
	deadline := start.Add(d.cfg.Duration)
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(deadline) {
					return
				}
				err := d.call(ctx, st, op, c.rng, c.number, c.values)
				took := time.Since(t0)
				if err != nil {
					c.errs++
					if c.first == nil {
						c.first = err
					}
					continue
				}
				c.calls++
				_ = c.h.RecordValue(min(max(int64(took), minNanos), maxNanos))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	total := hdrhistogram.New(minNanos, maxNanos, 3)
	r := Result{Op: op}
	for _, c := range clients {
		total.Merge(c.h)
		r.Calls += c.calls
		r.Errors += c.errs
		if c.first != nil && r.FirstError == "" {
			r.FirstError = c.first.Error()
		}
	}
	r.PerSecond = float64(r.Calls) / elapsed.Seconds()
	if r.Calls > 0 {
		r.P50 = time.Duration(total.ValueAtQuantile(50))
		r.P99 = time.Duration(total.ValueAtQuantile(99))
		r.Mean = time.Duration(total.Mean())
	}
	return r, nil
}

// commitValues is how many new values each client draws for its commits:
// drawing 512 random bytes per commit would be timed with the commit.
const commitValues = 16

// call performs one operation as client number c; values are its new
// values for commits.
func (d *dataset) call(ctx context.Context, st kv.Store, op string, rng *rand.Rand, c int, values [][]byte) error {
	switch op {
	case OpGet:
		i := rng.IntN(len(d.keys))
		_, err := st.Get(ctx, d.keys[i])
		return err
	case OpScan:
		return d.scan(ctx, st, d.keys[rng.IntN(len(d.keys))])
	default:
		return d.commit(ctx, st, rng, c, values)
	}
}

func (d *dataset) scan(ctx context.Context, st kv.Store, from []byte) error {
	return kv.ScanEach(ctx, st, kv.ScanOptions{Start: from, Limit: d.cfg.ScanLength, BatchSize: d.cfg.ScanLength},
		func(kv.Pair) error { return nil })
}

// errLostUpdate reports a CompareAndSwap that failed although its client
// is the only writer of that key: the store lost or invented a write.
var errLostUpdate = errors.New("a CompareAndSwap on a key only this client writes failed: the store does not hold the value it acknowledged")

// commit swaps one of client c's keys to a new value (one of values,
// never the value it holds, so a store that counts changed rows rather than
// matched ones still reports the swap), creates a fresh key and puts
// another of its keys.
func (d *dataset) commit(ctx context.Context, st kv.Store, rng *rand.Rand, c int, values [][]byte) error {
	n := d.cfg.Clients
	pick := func() int {
		owned := (len(d.keys) - c + n - 1) / n // keys i with i % n == c
		if owned == 0 {
			return -1
		}
		return c + n*rng.IntN(owned)
	}
	a, b := pick(), pick()
	if a < 0 {
		return fmt.Errorf("client %d owns no key: load more keys than there are clients", c)
	}
	for b == a && len(d.keys) > n {
		b = pick()
	}
	d.mu.Lock()
	d.fresh++
	fresh := fmt.Appendf(nil, "/kvbench-new/%0*d", max(d.cfg.KeySize-len("/kvbench-new/"), 1), d.fresh)
	d.mu.Unlock()
	next := values[rng.IntN(len(values))]
	if bytes.Equal(next, d.values[a]) {
		next = values[(slices.IndexFunc(values, func(v []byte) bool { return bytes.Equal(v, next) })+1)%len(values)]
	}
	ops := []kv.Op{kv.CompareAndSwap(d.keys[a], d.values[a], next), kv.PutIfAbsent(fresh, next)}
	if b != a {
		ops = append(ops, kv.Put(d.keys[b], next))
	}
	err := st.Commit(ctx, ops)
	if _, ok := kv.AsConflict(err); ok {
		return errLostUpdate
	}
	if err != nil {
		return err
	}
	d.values[a] = next
	if b != a {
		d.values[b] = next
	}
	return nil
}

// Cleanup deletes every key Run wrote to st (the loaded keys and the keys
// commits created), so a bench against a real database leaves nothing
// behind.
func Cleanup(ctx context.Context, st kv.Store, batch int) error {
	for _, prefix := range []string{"/kvbench/", "/kvbench-new/"} {
		end := []byte(prefix)
		end[len(end)-1]++
		for {
			it, err := st.Scan(ctx, kv.ScanOptions{Start: []byte(prefix), End: end, Limit: batch, BatchSize: batch, ValuePrefix: 1})
			if err != nil {
				return err
			}
			var ops []kv.Op
			for {
				b, err := it.Next(ctx)
				if err != nil {
					_ = it.Close()
					return err
				}
				if len(b) == 0 {
					break
				}
				for _, p := range b {
					ops = append(ops, kv.Delete(append([]byte(nil), p.Key...)))
				}
			}
			_ = it.Close()
			if len(ops) == 0 {
				break
			}
			if err := st.Commit(ctx, ops); err != nil {
				return err
			}
		}
	}
	return nil
}
