//go:build !wasip1

// Package sqltest holds what the SQL adaptors' tests (wasm/adaptors/postgres,
// wasm/adaptors/mysql) check alike: a shared throwaway database server and
// compiled adaptor per test binary (Env), the conformance of their
// connection handling (ManyRows, RefusedConfigs, IdleConnectionsClosed,
// Unavailable, ScanConns), commits cut around COMMIT on the wire
// (CommitCuts), and the benchmarks of Engram's write shapes. It runs the
// adaptors as Engram does, through the wasm host, so it is host-side code
// (never built for wasip1) and must not be linked into an adaptor.
package sqltest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/internal/proctest"
	"github.com/engramkv/engram/wasm/host"
)

// Env is one database server and one compiled SQL adaptor for the whole
// test binary (starting a server takes seconds): an adaptor's Test and
// Benchmark share them, and every store gets a table of its own, so each
// starts empty. The server is left running when the test binary ends;
// proctest's reaper stops it and removes its data.
type Env[S any] struct {
	Plugin       string // bin/PLUGIN.wasm
	Launch       func() (S, error)
	NotInstalled error
	// Config is the plugin's configuration for server, without a table,
	// and the address it must be allowed to dial.
	Config func(server S) (cfg, addr string)

	once     sync.Once
	server   S
	p        *host.Plugin
	err      error
	tables   int
	BenchSeq int
}

// Setup returns the shared server and plugin, skipping tb without the
// server's binaries unless CI is set.
func (e *Env[S]) Setup(tb testing.TB) (S, *host.Plugin) {
	tb.Helper()
	e.once.Do(func() {
		if e.server, e.err = e.Launch(); e.err != nil {
			return
		}
		path := adaptorPath(tb, e.Plugin)
		var cache string
		if cache, e.err = proctest.WasmCacheDir(path); e.err != nil {
			return
		}
		e.p, e.err = host.Load(context.Background(), path, host.Options{CacheDir: cache, Logger: testLogger()})
	})
	proctest.SkipIfMissing(tb, e.err, e.NotInstalled)
	return e.server, e.p
}

// Table returns the name of a table no store has used.
func (e *Env[S]) Table() string {
	e.tables++
	return fmt.Sprintf("t%d", e.tables)
}

// Open opens a store on a fresh table, with extra settings, closed at
// cleanup.
func (e *Env[S]) Open(tb testing.TB, extra string, opts host.StoreOptions) host.Engine {
	tb.Helper()
	s, _ := e.OpenTable(tb, extra, opts)
	return s
}

// OpenTable is Open that also returns the table's name.
func (e *Env[S]) OpenTable(tb testing.TB, extra string, opts host.StoreOptions) (host.Engine, string) {
	tb.Helper()
	server, p := e.Setup(tb)
	cfg, addr := e.Config(server)
	table := e.Table()
	opts.Config = fmt.Appendf(nil, "%s table=%s %s", cfg, table, extra)
	opts.AllowedAddresses = []string{addr}
	if opts.PoolSize == 0 {
		opts.PoolSize = 2
	}
	s, err := p.Open(context.Background(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s, table
}

// BenchAdaptor runs the Get, Commit3 and Commit3Fenced benchmarks on s;
// seq numbers the object keys across runs on one store (-count reruns on
// it). Commit3Fenced adds what a cluster leader's batch carries: a
// compare-and-swap of a term record to the value it holds.
func BenchAdaptor(b *testing.B, s kv.Store, seq *int) {
	ctx := context.Background()
	rev := []byte("rev/key")
	if err := s.Commit(ctx, []kv.Op{kv.Put(rev, []byte("0"))}); err != nil {
		b.Fatal(err)
	}
	b.Run("Get", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Get(ctx, rev); err != nil {
				b.Fatal(err)
			}
		}
	})
	term := []byte("term")
	if err := s.Commit(ctx, []kv.Op{kv.Put(term, []byte("1"))}); err != nil {
		b.Fatal(err)
	}
	for _, fenced := range []bool{false, true} {
		name := "Commit3"
		if fenced {
			name = "Commit3Fenced"
		}
		b.Run(name, func(b *testing.B) {
			cur, err := s.Get(ctx, rev)
			if err != nil {
				b.Fatal(err)
			}
			value := []byte(strings.Repeat("v", 500))
			for b.Loop() {
				*seq++
				next := []byte(strconv.Itoa(*seq))
				ops := []kv.Op{
					kv.CompareAndSwap(rev, cur, next),
					kv.PutIfAbsent(fmt.Appendf(nil, "obj/%08d", *seq), value),
					kv.Put([]byte("meta/last"), next),
				}
				if fenced {
					ops = append(ops, kv.CompareAndSwap(term, []byte("1"), []byte("1")))
				}
				if err := s.Commit(ctx, ops); err != nil {
					b.Fatal(err)
				}
				cur = next
			}
		})
	}
}

// BenchGroups runs the group benchmarks on s: one Commit shaped like
// Engram's write group of 300 clients' requests, the batch whose
// cost bounds a SQL store's write throughput once the writer pipelines its
// commits. CreateGroup300 is 300 creates: a put-if-absent of each new
// revision key (random 70-byte keys, a 512-byte value with its header) and
// the change-log record of each revision (the first put-if-absent). Update
// Group300 is 300 updates of those keys: a compare-and-swap of each revision
// key, the replaced version moved to history, and the change-log records.
// ops/s in the output counts the batch's ops.
func BenchGroups(b *testing.B, s kv.Store, seq *int) {
	ctx := context.Background()
	const group = 300
	rng := rand.New(rand.NewPCG(1, uint64(*seq)))
	value := make([]byte, 600)
	var keys [][]byte
	var cur [][]byte
	b.Run("CreateGroup300", func(b *testing.B) {
		b.ReportAllocs()
		defer proctest.ReportCPU(b)()
		for b.Loop() {
			keys, cur = keys[:0], cur[:0]
			ops := make([]kv.Op, 0, 2*group)
			for range group {
				k := make([]byte, 70)
				for i := range k {
					k[i] = 'a' + byte(rng.IntN(26))
				}
				keys = append(keys, k)
				cur = append(cur, value)
				ops = append(ops, kv.PutIfAbsent(append([]byte("r/"), k...), value))
			}
			for i := range group {
				*seq++
				op := kv.Put(fmt.Appendf(nil, "e/%016x", *seq), make([]byte, 100))
				if i == 0 {
					op.Kind = kv.OpPutIfAbsent
				}
				ops = append(ops, op)
			}
			if err := s.Commit(ctx, ops); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(2*group*b.N)/b.Elapsed().Seconds(), "ops/s")
	})
	b.Run("UpdateGroup300", func(b *testing.B) {
		if len(keys) < group {
			b.Skip("CreateGroup300 did not run")
		}
		b.ReportAllocs()
		defer proctest.ReportCPU(b)()
		for b.Loop() {
			ops := make([]kv.Op, 0, 3*group)
			next := make([][]byte, group)
			for i, k := range keys {
				*seq++
				next[i] = fmt.Appendf(append([]byte(nil), value[:500]...), "%016x", *seq)
				ops = append(ops, kv.CompareAndSwap(append([]byte("r/"), k...), cur[i], next[i]))
				ops = append(ops, kv.Put(fmt.Appendf(append([]byte("h/"), k...), "/%016x", *seq), cur[i]))
			}
			for i := range group {
				op := kv.Put(fmt.Appendf(nil, "e/%016x", *seq+int(i)+1), make([]byte, 100))
				if i == 0 {
					op.Kind = kv.OpPutIfAbsent
				}
				ops = append(ops, op)
			}
			*seq += group
			if err := s.Commit(ctx, ops); err != nil {
				b.Fatal(err)
			}
			cur = next
		}
		b.ReportMetric(float64(3*group*b.N)/b.Elapsed().Seconds(), "ops/s")
	})
}

// BigCommitTimeout is the call timeout for ManyRows' store: its 20 MiB
// commits took over the host's default 10 s in a fresh-clone make test,
// under the race detector beside the other suites (MariaDB, durability off).
// It guards against a hang; the test checks atomicity, not speed.
const BigCommitTimeout = 2 * time.Minute

// ManyRows commits batches of hundreds of ops of one kind, which the
// SQL adaptors write as multi-row statements: a failed condition inside
// such a statement must still name the lowest failing op with its key's
// value and apply nothing, and a run bigger than one packet (MariaDB's
// max_allowed_packet is 16 MiB) must split and still be atomic. Open s
// with CallTimeout BigCommitTimeout.
func ManyRows(t *testing.T, s kv.Store) {
	ctx := context.Background()
	key := func(p string, i int) []byte { return fmt.Appendf(nil, "%s/%03d", p, i) }
	var ops []kv.Op
	for i := range 300 {
		ops = append(ops, kv.Put(key("m", i), []byte("v0")))
	}
	ops = append(ops, kv.Put(key("n", 150), []byte("x150")), kv.Put(key("n", 200), []byte("x200")))
	if err := s.Commit(ctx, ops); err != nil {
		t.Fatal(err)
	}
	expect := func(name string, ops []kv.Op, index int, current string) {
		t.Helper()
		err := s.Commit(ctx, ops)
		ce, ok := kv.AsConflict(err)
		if !ok || ce.Index != index || !bytes.Equal(ce.Key, ops[index].Key) || !ce.Exists || string(ce.Current) != current {
			t.Errorf("%s: Commit = %v, want a conflict on op %d (%s) holding %q", name, err, index, ops[index].Key, current)
		}
	}
	// Put-if-absents in descending key order: n/200 (op 99) fails before
	// n/150 (op 149) in the batch, after it in the statement.
	ops = ops[:0]
	for i := 299; i >= 0; i-- {
		ops = append(ops, kv.PutIfAbsent(key("n", i), []byte("new")))
	}
	expect("put-if-absent", ops, 99, "x200")
	cas := func(from string, wrong int) []kv.Op {
		var ops []kv.Op
		for i := range 300 {
			exp := from
			if i == wrong {
				exp = "nope"
			}
			ops = append(ops, kv.CompareAndSwap(key("m", i), []byte(exp), []byte("v1")))
		}
		return ops
	}
	expect("compare-and-swap", cas("v0", 120), 120, "v0")
	cad := cas("v0", 7)
	for i := range cad {
		cad[i] = kv.CompareAndDelete(cad[i].Key, cad[i].Expected)
	}
	expect("compare-and-delete", cad, 7, "v0")
	for i := range 300 {
		if v, err := s.Get(ctx, key("m", i)); err != nil || string(v) != "v0" {
			t.Fatalf("%s = %q, %v after failed batches, want v0", key("m", i), v, err)
		}
		if _, err := s.Get(ctx, key("n", i)); i != 150 && i != 200 && !errors.Is(err, kv.ErrNotFound) {
			t.Fatalf("%s exists after a failed batch (%v)", key("n", i), err)
		}
	}
	// The same kinds succeeding, with a put run beside them.
	ops = cas("v0", -1)
	for i := range 300 {
		ops = append(ops, kv.Put(key("p", i), []byte("p")))
	}
	if err := s.Commit(ctx, ops); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, key("m", 299)); err != nil || string(v) != "v1" {
		t.Errorf("m/299 = %q, %v, want v1", v, err)
	}
	// 20 MiB of put-if-absents, the last one failing: several packets.
	big := make([]byte, 1<<20)
	ops = ops[:0]
	for i := range 20 {
		ops = append(ops, kv.PutIfAbsent(key("big", i), big))
	}
	ops = append(ops, kv.PutIfAbsent(key("m", 0), big))
	expect("put-if-absent over several packets", ops, 20, "v1")
	if _, err := s.Get(ctx, key("big", 0)); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf("big/000 exists after a failed batch (%v)", err)
	}
	if err := s.Commit(ctx, ops[:20]); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, key("big", 19)); err != nil || len(v) != len(big) {
		t.Errorf("big/019 holds %d bytes, %v", len(v), err)
	}
}

// RefusedConfig is a configuration INIT must refuse, with an error that
// mentions want.
type RefusedConfig struct {
	Name, Config, Want string
}

// RefusedConfigs checks cases, whose server is at addr, and the
// address checks with good, a configuration that works.
func RefusedConfigs(t *testing.T, p *host.Plugin, addr string, cases []RefusedConfig, good string) {
	open := func(name, cfg string, allowed []string, want string) {
		_, err := p.Open(context.Background(), host.StoreOptions{Config: []byte(cfg), AllowedAddresses: allowed, PoolSize: 1})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Open = %v, want an error mentioning %q", name, err, want)
		}
	}
	for _, c := range cases {
		open(c.Name, c.Config, []string{addr}, c.Want)
	}
	open("no allowed address", good, nil, "allowed-addresses")
	open("address not allowed", good, []string{"127.0.0.1:1"}, "allowed-addresses")
}

// IdleConnectionsClosed checks calls on s after kill has ended the
// connections s keeps idle in its pool: each finds out on first use and
// runs again on a new connection (nothing was applied, since no COMMIT
// was sent), so none fails.
func IdleConnectionsClosed(t *testing.T, s kv.Store, kill func() error) {
	ctx := context.Background()
	var ops []kv.Op
	for i := range 30 {
		ops = append(ops, kv.Put(fmt.Appendf(nil, "idle/%02d", i), []byte("v")))
	}
	if err := s.Commit(ctx, ops); err != nil {
		t.Fatal(err)
	}
	// Two connections: a long scan holds one while a Get uses another.
	it, err := s.Scan(ctx, kv.ScanOptions{BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, []byte("idle/00")); err != nil {
		t.Fatal(err)
	}
	_ = it.Close()
	for round := range 3 {
		if err := kill(); err != nil {
			t.Fatal(err)
		}
		var err error
		switch round {
		case 0:
			_, err = s.Get(ctx, []byte("idle/01"))
		case 1:
			err = s.Commit(ctx, []kv.Op{kv.CompareAndSwap([]byte("idle/01"), []byte("v"), []byte("w"))})
		case 2:
			var it kv.Iterator
			if it, err = s.Scan(ctx, kv.ScanOptions{BatchSize: 100}); err == nil {
				var b []kv.Pair
				b, err = it.Next(ctx)
				if err == nil && len(b) != 30 {
					err = fmt.Errorf("scan: %d pairs", len(b))
				}
				_ = it.Close()
			}
		}
		if err != nil {
			t.Errorf("round %d, after the server closed the idle connections: %v", round, err)
		}
	}
	if v, err := s.Get(ctx, []byte("idle/01")); err != nil || string(v) != "w" {
		t.Errorf("after the rounds: %q, %v; want w", v, err)
	}
}

// Unavailable checks a server that goes away under a store opened
// with cfg (at addr) until stop: calls fail cleanly (nothing applied,
// UNAVAILABLE), never hang, and never claim success.
func Unavailable(t *testing.T, p *host.Plugin, cfg, addr string, stop func() error) {
	s, err := p.Open(context.Background(), host.StoreOptions{Config: []byte(cfg),
		AllowedAddresses: []string{addr}, PoolSize: 1, CallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte("v"))}); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, []byte("k")); !errors.Is(err, host.ErrUnavailable) {
		t.Errorf("Get with the server gone: %v, want UNAVAILABLE", err)
	}
	err = s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte("w"))})
	if !errors.Is(err, host.ErrUnavailable) {
		t.Errorf("Commit with the server gone: %v, want UNAVAILABLE (a certain failure)", err)
	}
	if _, err := s.Get(ctx, []byte("k")); !errors.Is(err, host.ErrUnavailable) {
		t.Errorf("Get with the server refusing connections: %v, want UNAVAILABLE", err)
	}
}

// ScanConns checks how scans share an instance's connections: a
// scan longer than one batch holds a connection (its snapshot transaction)
// until it ends; scans may take all but one, so Get and Commit keep
// working while a scan that finds none left fails cleanly.
func ScanConns(t *testing.T, s host.Engine) {
	ctx := context.Background()
	var ops []kv.Op
	for i := range 50 {
		ops = append(ops, kv.Put([]byte(fmt.Sprintf("k%03d", i)), []byte("v")))
	}
	if err := s.Commit(ctx, ops); err != nil {
		t.Fatal(err)
	}
	long := kv.ScanOptions{BatchSize: 10}
	it1, err := s.Scan(ctx, long)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := it1.Next(ctx); err != nil || len(b) != 10 {
		t.Fatalf("first batch: %d pairs, %v", len(b), err)
	}
	// pool-size=2: it1 holds the one connection scans may use.
	if _, err := s.Scan(ctx, long); !errors.Is(err, host.ErrUnavailable) {
		t.Errorf("second long scan while the first holds its connection: %v, want UNAVAILABLE", err)
	}
	if _, err := s.Get(ctx, []byte("k001")); err != nil {
		t.Errorf("Get while a scan holds a connection: %v", err)
	}
	if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("k001"), []byte("w"))}); err != nil {
		t.Errorf("Commit while a scan holds a connection: %v", err)
	}
	// A scan that fits in one batch needs no connection of its own.
	short, err := s.Scan(ctx, kv.ScanOptions{Limit: 5})
	if err != nil {
		t.Fatalf("short scan: %v", err)
	}
	if b, err := short.Next(ctx); err != nil || len(b) != 5 {
		t.Errorf("short scan: %d pairs, %v", len(b), err)
	}
	_ = short.Close()
	n := 10
	for {
		b, err := it1.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) == 0 {
			break
		}
		for _, p := range b {
			if string(p.Key) == "k001" && string(p.Value) != "v" {
				t.Errorf("the scan saw a commit made after it started")
			}
		}
		n += len(b)
	}
	if n != 50 {
		t.Errorf("long scan yielded %d pairs, want 50", n)
	}
	_ = it1.Close()
	it2, err := s.Scan(ctx, long)
	if err != nil {
		t.Fatalf("long scan after the first ended: %v", err)
	}
	_ = it2.Close()
}

// CommitCuts checks the commit error mapping with a connection cut
// through a cutProxy in front of the server at target, at the two points
// that matter: before COMMIT is sent (nothing applied: a certain failure,
// never UNCERTAIN; or, on a pooled connection, run again on a new one)
// and right after (UNCERTAIN: the server may have committed), then that
// Engram's resolution (read back) finds the outcome. config is the
// plugin's configuration with the proxy's address; commit matches the
// COMMIT statement on the wire.
func CommitCuts(t *testing.T, p *host.Plugin, target string, config func(addr string) string, commit string) {
	ctx := context.Background()
	px := startCutProxy(t, target)
	s, err := p.Open(ctx, host.StoreOptions{Config: []byte(config(px.addr)), AllowedAddresses: []string{px.addr}, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte("v0"))}); err != nil {
		t.Fatal(err)
	}

	// The round trip with BEGIN and the writes never reaches the server
	// (the new value travels in it, inline or bound). The pooled
	// connection failing on its first use in a call looks like one the
	// server closed while idle: the plugin runs the batch again on a new
	// connection, safely, since no COMMIT was sent. Cut that one too, and
	// the commit fails, certainly.
	px.armN("v1-cut-before", false, 2)
	err = s.Commit(ctx, []kv.Op{kv.CompareAndSwap([]byte("k"), []byte("v0"), []byte("v1-cut-before"))})
	if err == nil || errors.Is(err, kv.ErrUncertain) {
		t.Errorf("commit cut before COMMIT: %v, want a certain failure", err)
	}
	if v, err := s.Get(ctx, []byte("k")); err != nil || string(v) != "v0" {
		t.Errorf("after a commit cut before COMMIT: %q, %v; want v0", v, err)
	}
	// One cut: the new connection succeeds.
	px.arm("v1-retried", false)
	if err := s.Commit(ctx, []kv.Op{kv.CompareAndSwap([]byte("k"), []byte("v0"), []byte("v1-retried"))}); err != nil {
		t.Errorf("commit cut before COMMIT on a pooled connection: %v, want it run again on a new one", err)
	}
	if v, err := s.Get(ctx, []byte("k")); err != nil || string(v) != "v1-retried" {
		t.Errorf("after a commit run again: %q, %v; want v1-retried", v, err)
	}

	// COMMIT reaches the server, which commits before it can notice the
	// connection is gone; its answer never comes back.
	px.arm(commit, true)
	err = s.Commit(ctx, []kv.Op{kv.CompareAndSwap([]byte("k"), []byte("v1-retried"), []byte("v2"))})
	if !errors.Is(err, kv.ErrUncertain) {
		t.Errorf("commit cut after COMMIT was sent: %v, want UNCERTAIN", err)
	}
	if v, err := s.Get(ctx, []byte("k")); err != nil || string(v) != "v2" {
		t.Errorf("after an uncertain commit: %q, %v; want v2 (the server committed)", v, err)
	}
	if px.cuts != 4 {
		t.Errorf("proxy cut %d connections, want 4", px.cuts)
	}

	// Engram resolves an uncertain commit by reading back (core/internal/retry);
	// through the whole server, the same cut must end in one clear
	// answer, and the store must hold what that answer says.
	srv := servertest.Start(t, s, servertest.Options{})
	c := srv.Client(t)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := c.Put(cctx, "/registry/x", "before"); err != nil {
		t.Fatal(err)
	}
	px.arm(commit, true)
	_, err = c.Put(cctx, "/registry/x", "after")
	got, gerr := c.Get(cctx, "/registry/x")
	if gerr != nil || len(got.Kvs) != 1 {
		t.Fatalf("read after the cut: %v %v", gerr, got)
	}
	switch v := string(got.Kvs[0].Value); {
	case err == nil && v != "after":
		t.Errorf("put acknowledged after an uncertain commit, but the key holds %q", v)
	case err != nil && v != "before":
		t.Errorf("put failed (%v) after an uncertain commit, but the key holds %q", err, v)
	}
	if px.cuts != 5 {
		t.Errorf("proxy cut %d connections, want 5", px.cuts)
	}
}

// adaptorPath is bin/NAME.wasm at the repository's top, where `make
// adaptors` builds it; without it the test fails under CI and is skipped
// otherwise.
func adaptorPath(tb testing.TB, name string) string {
	tb.Helper()
	_, file, _, _ := runtime.Caller(0)
	return proctest.BuiltFile(tb, filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "bin", name+".wasm"), "adaptors")
}

// testLogger shows the host's and the adaptor's logs under go test -v.
func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}
