package host

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvtest"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/internal/pgtest"
)

// TestPostgres runs postgres.wasm against a throwaway PostgreSQL (skipped
// without PostgreSQL binaries unless CI is set): the conformance suite, the
// whole server through clientv3, refused configurations, and a latency
// probe. One server and one compiled plugin serve every subtest; each store
// gets a table of its own, so each starts empty.
func TestPostgres(t *testing.T) {
	pg := pgtest.Start(t)
	path := pluginPath(t, "postgres")
	cache, err := pgtest.WasmCacheDir(path)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p := loadPlugin(t, "postgres", Options{CacheDir: cache})
	t.Logf("PostgreSQL %s on %s; postgres.wasm loaded in %v", pg.Version, pg.Addr, time.Since(start).Round(time.Millisecond))
	tables := 0
	open := func(t *testing.T, extra string) *Store {
		t.Helper()
		tables++
		cfg := fmt.Sprintf("url=%s table=t%d %s", pg.URL(""), tables, extra)
		s, err := p.Open(context.Background(), StoreOptions{Config: []byte(cfg), AllowedAddresses: []string{pg.Addr}, PoolSize: 2})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	t.Run("Conformance", func(t *testing.T) {
		kvtest.Run(t, func(t *testing.T) kv.Store { return open(t, "") })
	})

	t.Run("Manifest", func(t *testing.T) {
		s := open(t, "pool-size=2")
		defer s.Close()
		m, f := s.Manifest(), s.Features()
		if m.Name != "postgres" || m.Model.String() != "pooled" || !f.Durable {
			t.Errorf("manifest %+v, features %+v", m, f)
		}
	})

	t.Run("ScanConnections", func(t *testing.T) {
		tables++
		cfg := fmt.Sprintf("url=%s table=t%d pool-size=2", pg.URL(""), tables)
		s, err := p.Open(context.Background(), StoreOptions{Config: []byte(cfg), AllowedAddresses: []string{pg.Addr}, PoolSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		postgresScanConns(t, s)
	})

	t.Run("Server", func(t *testing.T) {
		st := open(t, "")
		t.Cleanup(func() { _ = st.Close() })
		serverSmoke(t, servertest.Start(t, servertest.Options{Store: st}))
	})

	t.Run("RefusedConfig", func(t *testing.T) {
		cases := []struct {
			name, cfg string
			allowed   []string
			want      string
		}{
			{"no url", "table=x", []string{pg.Addr}, "url=postgres://"},
			{"unknown setting", "url=" + pg.URL("") + " colour=blue", []string{pg.Addr}, `unknown setting "colour"`},
			{"bad table", "url=" + pg.URL("") + ` table=a;drop`, []string{pg.Addr}, "not a plain SQL identifier"},
			{"bad pool size", "url=" + pg.URL("") + " pool-size=1", []string{pg.Addr}, "pool-size"},
			{"no allowed address", "url=" + pg.URL(""), nil, "allowed-addresses"},
			{"address not allowed", "url=" + pg.URL(""), []string{"127.0.0.1:1"}, "allowed-addresses"},
			{"no such database", "url=" + pg.URL("nosuchdb"), []string{pg.Addr}, "nosuchdb"},
		}
		for _, c := range cases {
			_, err := p.Open(context.Background(), StoreOptions{Config: []byte(c.cfg), AllowedAddresses: c.allowed, PoolSize: 1})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: Open = %v, want an error mentioning %q", c.name, err, c.want)
			}
		}
	})

	t.Run("NotAnEngramTable", func(t *testing.T) {
		// A table that exists with other columns is refused at INIT, not
		// written into. pg_class is a view-free catalog table every
		// database has.
		_, err := p.Open(context.Background(), StoreOptions{Config: []byte("url=" + pg.URL("") + " table=pg_catalog.pg_class"),
			AllowedAddresses: []string{pg.Addr}, PoolSize: 1})
		if err == nil || !strings.Contains(err.Error(), "not an Engram table") {
			t.Errorf("Open on pg_class = %v", err)
		}
	})

	t.Run("CommitCuts", func(t *testing.T) {
		tables++
		postgresCommitCuts(t, p, pg, fmt.Sprintf("t%d", tables))
	})

	t.Run("Unavailable", func(t *testing.T) {
		// A server that goes away: calls fail cleanly (nothing applied,
		// UNAVAILABLE), never hang, and never claim success.
		pg2 := pgtest.Start(t)
		s, err := p.Open(context.Background(), StoreOptions{Config: []byte("url=" + pg2.URL("") + " table=gone"),
			AllowedAddresses: []string{pg2.Addr}, PoolSize: 1, CallTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx := context.Background()
		if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte("v"))}); err != nil {
			t.Fatal(err)
		}
		if err := pg2.Stop(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, []byte("k")); !errors.Is(err, ErrUnavailable) {
			t.Errorf("Get with the server gone: %v, want UNAVAILABLE", err)
		}
		err = s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte("w"))})
		if err == nil || errors.Is(err, kv.ErrUncertain) {
			t.Errorf("Commit with the server gone: %v, want a certain failure", err)
		}
	})

	t.Run("Latency", func(t *testing.T) {
		s := open(t, "")
		defer s.Close()
		get, commit := postgresLatency(t, s, 300)
		t.Logf("postgres.wasm through the host, PostgreSQL %s on loopback (fsync off), 1 client: Get p50 %v p99 %v; 3-op Commit (CAS+PutIfAbsent+Put) p50 %v p99 %v",
			pg.Version, get[0], get[1], commit[0], commit[1])
	})
}

// postgresLatency measures n sequential Gets and n 3-op commits shaped like
// Engram's writes (a CAS on the revision key, a new object key, a meta put)
// and returns their p50 and p99.
func postgresLatency(t *testing.T, s kv.Store, n int) (get, commit [2]time.Duration) {
	ctx := context.Background()
	rev := []byte("rev/key")
	if err := s.Commit(ctx, []kv.Op{kv.Put(rev, []byte("0"))}); err != nil {
		t.Fatal(err)
	}
	gets := make([]time.Duration, 0, n)
	commits := make([]time.Duration, 0, n)
	cur := []byte("0")
	for i := range n + 20 {
		next := []byte(fmt.Sprint(i + 1))
		ops := []kv.Op{
			kv.CompareAndSwap(rev, cur, next),
			kv.PutIfAbsent([]byte(fmt.Sprintf("obj/key/%08d", i)), []byte(strings.Repeat("v", 500))),
			kv.Put([]byte("meta/last"), next),
		}
		t0 := time.Now()
		if err := s.Commit(ctx, ops); err != nil {
			t.Fatal(err)
		}
		d := time.Since(t0)
		cur = next
		t0 = time.Now()
		if _, err := s.Get(ctx, rev); err != nil {
			t.Fatal(err)
		}
		if i >= 20 { // the first calls prepare statements
			commits = append(commits, d)
			gets = append(gets, time.Since(t0))
		}
	}
	pct := func(ds []time.Duration) [2]time.Duration {
		slices.Sort(ds)
		return [2]time.Duration{ds[len(ds)/2].Round(time.Microsecond), ds[len(ds)*99/100].Round(time.Microsecond)}
	}
	return pct(gets), pct(commits)
}

// postgresScanConns checks how scans share an instance's connections: a
// scan longer than one batch holds a connection (its snapshot transaction)
// until it ends; scans may take all but one, so Get and Commit keep
// working while a scan that finds none left fails cleanly.
func postgresScanConns(t *testing.T, s *Store) {
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
	if _, err := s.Scan(ctx, long); !errors.Is(err, ErrUnavailable) {
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

// postgresCommitCuts checks the commit error mapping with a connection cut
// at the two points that matter: before COMMIT is sent (nothing applied: a
// certain failure, never UNCERTAIN) and right after (UNCERTAIN: the server
// may have committed).
func postgresCommitCuts(t *testing.T, p *Plugin, pg *pgtest.Server, table string) {
	ctx := context.Background()
	px := startCutProxy(t, pg.Addr)
	url := strings.Replace(pg.URL(""), pg.Addr, px.addr, 1)
	s, err := p.Open(ctx, StoreOptions{Config: []byte("url=" + url + " table=" + table), AllowedAddresses: []string{px.addr}, PoolSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte("v0"))}); err != nil {
		t.Fatal(err)
	}

	// The pipeline with BEGIN and the writes never reaches the server
	// (statements are prepared by then, but the new value travels in
	// every Bind).
	px.arm("v1-cut-before", false)
	err = s.Commit(ctx, []kv.Op{kv.CompareAndSwap([]byte("k"), []byte("v0"), []byte("v1-cut-before"))})
	if err == nil || errors.Is(err, kv.ErrUncertain) {
		t.Errorf("commit cut before COMMIT: %v, want a certain failure", err)
	}
	if v, err := s.Get(ctx, []byte("k")); err != nil || string(v) != "v0" {
		t.Errorf("after a commit cut before COMMIT: %q, %v; want v0", v, err)
	}

	// COMMIT (a simple-protocol query, text on the wire) reaches the
	// server; its answer never comes back.
	px.arm("COMMIT\x00", true)
	err = s.Commit(ctx, []kv.Op{kv.CompareAndSwap([]byte("k"), []byte("v0"), []byte("v2"))})
	if !errors.Is(err, kv.ErrUncertain) {
		t.Errorf("commit cut after COMMIT was sent: %v, want UNCERTAIN", err)
	}
	v, err := s.Get(ctx, []byte("k"))
	if err != nil || (string(v) != "v0" && string(v) != "v2") {
		t.Errorf("after an uncertain commit: %q, %v; want v0 or v2", v, err)
	}
	t.Logf("uncertain commit: value afterwards %q (v2: the server committed)", v)
	if px.cuts != 2 {
		t.Errorf("proxy cut %d connections, want 2", px.cuts)
	}
}
