package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/memkv"
)

// faultyEnv is the faulty plugin in front of a remote store the test owns.
type faultyEnv struct {
	remote kv.Store
	srv    *remoteServer
	store  Engine
	reg    *prometheus.Registry
	p      *Plugin
	// logged receives a value after the plugin logs anything (at most one
	// pending).
	logged chan struct{}
}

func newFaulty(t *testing.T, opts Options, pool int) *faultyEnv {
	t.Helper()
	return newFaultyConfig(t, opts, pool, "")
}

// newFaultyConfig is newFaulty with more of the plugin's configuration
// (space=WORD).
func newFaultyConfig(t *testing.T, opts Options, pool int, config string) *faultyEnv {
	t.Helper()
	remote := memkv.New()
	srv := startRemote(t, remote)
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	logged := make(chan struct{}, 1)
	opts.Logger = slog.New(notifyHandler{inner: testLogger(t).Handler(), logged: logged})
	p := loadPlugin(t, "faulty", opts)
	s, err := p.Open(context.Background(), StoreOptions{
		Config:           []byte("addr=" + srv.addr + " " + config),
		PoolSize:         pool,
		AllowedAddresses: []string{srv.addr},
		CallTimeout:      5 * time.Second,
		AbortGrace:       200 * time.Millisecond,
		MaxResponse:      1 << 20,
		IdleInterval:     -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &faultyEnv{remote: remote, srv: srv, store: s, reg: reg, p: p, logged: logged}
}

// notifyHandler passes records to inner and signals logged after each one,
// whatever inner's level.
type notifyHandler struct {
	inner  slog.Handler
	logged chan struct{}
}

func (h notifyHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h notifyHandler) Handle(ctx context.Context, r slog.Record) error {
	var err error
	if h.inner.Enabled(ctx, r.Level) {
		err = h.inner.Handle(ctx, r)
	}
	select {
	case h.logged <- struct{}{}:
	default: // a wake-up is already pending
	}
	return err
}

func (h notifyHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return notifyHandler{inner: h.inner.WithAttrs(as), logged: h.logged}
}

func (h notifyHandler) WithGroup(name string) slog.Handler {
	return notifyHandler{inner: h.inner.WithGroup(name), logged: h.logged}
}

// seed writes keys the test checks after every misbehaviour.
func (e *faultyEnv) seed(t *testing.T) []kv.Pair {
	t.Helper()
	var ops []kv.Op
	var want []kv.Pair
	for i := range 50 {
		k, v := fmt.Appendf(nil, "seed/%03d", i), fmt.Appendf(nil, "value-%d", i)
		ops = append(ops, kv.Put(k, v))
		want = append(want, kv.Pair{Key: k, Value: v})
	}
	if err := e.store.Commit(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	return want
}

// checkServing checks that the store answers and the data is intact, read
// through the plugin (so through a healthy instance).
func (e *faultyEnv) checkServing(t *testing.T, want []kv.Pair) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	it, err := e.store.Scan(ctx, kv.ScanOptions{Start: []byte("seed/"), End: []byte("seed0"), BatchSize: 7})
	if err != nil {
		t.Fatalf("store no longer serves: Scan: %v", err)
	}
	defer it.Close()
	var got []kv.Pair
	for {
		b, err := it.Next(ctx)
		if err != nil {
			t.Fatalf("store no longer serves: Next: %v", err)
		}
		if len(b) == 0 {
			break
		}
		got = append(got, b...)
	}
	if len(got) != len(want) {
		t.Fatalf("after the misbehaviour the store holds %d seed keys, want %d", len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i].Key, want[i].Key) || !bytes.Equal(got[i].Value, want[i].Value) {
			t.Fatalf("seed pair %d corrupted: %q=%q", i, got[i].Key, got[i].Value)
		}
	}
}

// getCutOff reads key with a 300 ms deadline and returns the error and how
// long the call took. The guests that misbehave past the deadline sleep an
// hour, spin or wait forever, so a call that returns at all shows the guest
// was cut off; how soon is logged, not asserted, because it depends on the
// machine's load. The minute only guards against a hang.
func (e *faultyEnv) getCutOff(t *testing.T, key string) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	type result struct {
		took time.Duration
		err  error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		_, err := e.store.Get(ctx, []byte(key))
		done <- result{time.Since(start), err}
	}()
	select {
	case r := <-done:
		return r.took, r.err
	case <-time.After(time.Minute):
		t.Fatalf("Get(%q) still running after a minute: the guest was not cut off", key)
		return 0, nil
	}
}

// waitReplaced waits until the pool is back to its size. A replacement
// logs once it is in the pool, so the wait wakes on the plugin's log lines;
// the ten seconds only guard against a hang.
func (e *faultyEnv) waitReplaced(t *testing.T, size int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for e.store.Stats().Instances < size {
		select {
		case <-e.logged:
		case <-timeout:
			t.Fatalf("pool not refilled: %+v", e.store.Stats())
		}
	}
}

// TestFaultyMisbehaviours checks that every misbehaviour of a plugin
// instance gives the caller a clean error, that the instance is discarded
// and replaced, and that the store keeps serving with its data intact.
func TestFaultyMisbehaviours(t *testing.T) {
	e := newFaulty(t, Options{MemoryLimit: 96 << 20}, 2)
	want := e.seed(t)
	for _, c := range []struct {
		word  string
		crash bool // the instance must be discarded
		is    error
	}{
		{"panic", true, ErrCrashed},
		{"trap", true, ErrCrashed},
		{"exit", true, ErrCrashed},
		{"garbage", true, ErrProtocol},
		{"wronglen", true, ErrProtocol},
		{"empty", true, ErrProtocol},
		{"huge", true, ErrProtocol},
		// Sleeping (an hour) is cut off at the deadline plus the abort
		// grace.
		{"sleep", true, context.DeadlineExceeded},
		// A blocked socket read times out at the request's deadline; the
		// plugin answers DEADLINE and the instance stays.
		{"stall", false, context.DeadlineExceeded},
	} {
		t.Run(c.word, func(t *testing.T) {
			before := e.store.Stats()
			took, err := e.getCutOff(t, "faulty:"+c.word)
			if err == nil {
				t.Fatal("Get succeeded")
			}
			t.Logf("error: %v (after %v)", err, took.Round(time.Millisecond))
			if !errors.Is(err, c.is) {
				t.Errorf("error does not match %v", c.is)
			}
			var he *Error
			if !errors.As(err, &he) {
				t.Errorf("error is %T, want *host.Error", err)
			}
			if errors.Is(err, kv.ErrUncertain) || errors.Is(err, kv.ErrNotFound) {
				t.Errorf("a failed read must be neither uncertain nor not-found")
			}
			after := e.store.Stats()
			if c.crash && after.Failures != before.Failures+1 {
				t.Errorf("failures %d -> %d, want one more", before.Failures, after.Failures)
			}
			if !c.crash && after.Failures != before.Failures {
				t.Errorf("failures %d -> %d: a graceful DEADLINE must not discard the instance", before.Failures, after.Failures)
			}
			e.waitReplaced(t, 2)
			e.checkServing(t, want)
		})
	}
	st := e.store.Stats()
	if st.Replacements < 8 {
		t.Errorf("replacements = %d, want at least 8", st.Replacements)
	}
	if got := metricValue(t, e.reg, "engram_wasm_instance_failures_total"); got < 8 {
		t.Errorf("engram_wasm_instance_failures_total = %v, want >= 8", got)
	}
	if got := metricValue(t, e.reg, "engram_wasm_instances"); got != 2 {
		t.Errorf("engram_wasm_instances = %v, want 2", got)
	}
}

// TestFaultyCommits checks COMMIT outcomes: a crash after the request was
// delivered is uncertain; UNCERTAIN answers are passed on; and the data says
// what really happened.
func TestFaultyCommits(t *testing.T) {
	e := newFaulty(t, Options{}, 2)
	want := e.seed(t)
	ctx := context.Background()
	for _, c := range []struct {
		word    string
		applied bool
	}{
		{"trap", false},
		{"garbage", false},
		{"uncertain", true},
		{"uncertain-lost", false},
	} {
		key := []byte("c/faulty:" + c.word)
		err := e.store.Commit(ctx, []kv.Op{kv.Put(key, []byte("v"))})
		if !errors.Is(err, kv.ErrUncertain) {
			t.Errorf("%s: Commit = %v, want kv.ErrUncertain", c.word, err)
		}
		_, gerr := e.remote.Get(ctx, key)
		if applied := gerr == nil; applied != c.applied {
			t.Errorf("%s: applied = %v, want %v", c.word, applied, c.applied)
		}
		e.waitReplaced(t, 2)
	}
	// A malformed batch is refused before it is sent: certain.
	err := e.store.Commit(ctx, []kv.Op{kv.Put([]byte("d"), nil), kv.Put([]byte("d"), nil)})
	if err == nil || errors.Is(err, kv.ErrUncertain) {
		t.Errorf("duplicate-key batch: %v, want a certain error", err)
	}
	e.checkServing(t, want)
}

// TestFaultyLeak leaks memory until the instance hits its limit and traps.
func TestFaultyLeak(t *testing.T) {
	e := newFaulty(t, Options{MemoryLimit: 64 << 20}, 1)
	want := e.seed(t)
	var err error
	for i := 0; i < 20 && err == nil; i++ {
		_, err = e.store.Get(context.Background(), []byte("faulty:leak"))
		if errors.Is(err, kv.ErrNotFound) {
			err = nil
		}
	}
	if !errors.Is(err, ErrCrashed) {
		t.Fatalf("leaking never crashed the instance: %v", err)
	}
	t.Logf("out of memory: %v", err)
	e.waitReplaced(t, 1)
	e.checkServing(t, want)
}

// TestFaultySpinUntrusted: only the untrusted runtime can stop a guest
// spinning without host calls (in the trusted one it would hang the
// process, including the garbage collector).
func TestFaultySpinUntrusted(t *testing.T) {
	e := newFaulty(t, Options{Untrusted: true}, 1)
	want := e.seed(t)
	took, err := e.getCutOff(t, "faulty:spin")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("spin: %v, want a deadline error", err)
	}
	t.Logf("spin stopped after %v", took.Round(time.Millisecond))
	e.waitReplaced(t, 1)
	e.checkServing(t, want)
}

// TestSingleInstanceCrashFailsClosed: memkv.wasm keeps its data in its
// memory; when its instance dies (here: out of memory), the store refuses
// every later call rather than serve an empty replacement.
func TestSingleInstanceCrashFailsClosed(t *testing.T) {
	p := loadPlugin(t, "memkv", Options{MemoryLimit: 16 << 20})
	s, err := p.Open(context.Background(), StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	big := bytes.Repeat([]byte("x"), 1<<20)
	var cerr error
	for i := 0; i < 64 && cerr == nil; i++ {
		cerr = s.Commit(ctx, []kv.Op{kv.Put(fmt.Appendf(nil, "k%d", i), big)})
	}
	if !errors.Is(cerr, ErrCrashed) {
		t.Fatalf("filling memory: %v, want a crash", cerr)
	}
	if _, err := s.Get(ctx, []byte("k0")); !errors.Is(err, ErrStateLost) || !errors.Is(err, kv.ErrClosed) {
		t.Fatalf("Get after the crash = %v, want ErrStateLost (kv.ErrClosed)", err)
	}
	if !s.Stats().Lost {
		t.Error("Stats().Lost is false")
	}
}

// metricValue returns the value of a plugin="faulty" counter or gauge.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "plugin" && l.GetValue() == "faulty" {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("metric %s{plugin=faulty} not found", name)
	return 0
}
