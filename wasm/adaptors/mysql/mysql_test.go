//go:build !wasip1

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvtest"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/internal/mysqltest"
	"github.com/engramkv/engram/wasm/adaptors/internal/sqltest"
	"github.com/engramkv/engram/wasm/host"
)

// mysqlEnv is the MariaDB and mysql.wasm of TestMySQL and BenchmarkMySQL.
var mysqlEnv = &sqltest.Env[*mysqltest.Server]{
	Plugin:       "mysql",
	Launch:       mysqltest.Launch,
	NotInstalled: mysqltest.ErrNotInstalled,
	Config: func(s *mysqltest.Server) (string, string) {
		return "dsn=" + s.DSN(""), s.Addr
	},
}

// TestMySQL runs mysql.wasm against a throwaway MariaDB (skipped without
// MariaDB unless CI is set): the conformance suite, key order at the edges
// MySQL gets wrong by default, the whole server through clientv3, refused
// configurations, commits cut around COMMIT, a server that goes away, and
// concurrent batches that name the same keys in opposite orders.
func TestMySQL(t *testing.T) {
	my, p := mysqlEnv.Setup(t)
	t.Logf("MariaDB %s on %s", my.Version, my.Addr)

	t.Run("Conformance", func(t *testing.T) {
		kvtest.Run(t, func(t *testing.T) kv.Store { return mysqlEnv.Open(t, "", host.StoreOptions{}) })
	})

	t.Run("Space", func(t *testing.T) { mysqlSpace(t, my) })

	t.Run("Manifest", func(t *testing.T) {
		s := mysqlEnv.Open(t, "pool-size=2", host.StoreOptions{})
		m, f := s.Manifest(), s.Features()
		if m.Name != "mysql" || m.Model.String() != "pooled" || !f.Durable {
			t.Errorf("manifest %+v, features %+v", m, f)
		}
	})

	t.Run("KeyOrder", func(t *testing.T) {
		mysqlKeyOrder(t, mysqlEnv.Open(t, "", host.StoreOptions{}))
	})

	t.Run("BigBatch", func(t *testing.T) {
		// 18 MiB of values with every byte value in them: more than
		// MariaDB's max_allowed_packet (16 MiB), so the statements go in
		// several round trips of one transaction.
		s := mysqlEnv.Open(t, "", host.StoreOptions{})
		ctx := context.Background()
		var ops []kv.Op
		for i := range 6 {
			v := make([]byte, 3<<20)
			for j := range v {
				v[j] = byte(j*7 + i)
			}
			ops = append(ops, kv.Put([]byte{'b', byte(i), 0, '\\', '\'', ' '}, v))
		}
		ops = append(ops, kv.PutIfAbsent([]byte("big/cond"), []byte("x")))
		if err := s.Commit(ctx, ops); err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			if v, err := s.Get(ctx, op.Key); err != nil || !bytes.Equal(v, op.Value) {
				t.Errorf("Get(%q): %d bytes, %v; want the %d bytes written", op.Key, len(v), err, len(op.Value))
			}
		}
		// A conflict in a later packet rolls back the earlier ones.
		rewritten := bytes.Repeat([]byte{'r'}, 3<<20)
		for i := range ops {
			ops[i].Value = rewritten
		}
		err := s.Commit(ctx, ops)
		var ce *kv.ConflictError
		if !errors.As(err, &ce) || ce.Index != len(ops)-1 {
			t.Fatalf("batch whose last op conflicts: %v", err)
		}
		if v, err := s.Get(ctx, ops[0].Key); err != nil || len(v) != 3<<20 || bytes.Equal(v, rewritten) {
			t.Errorf("after the conflicting batch: %d bytes, %v; want the first batch's value", len(v), err)
		}
	})

	t.Run("ScanConnections", func(t *testing.T) {
		sqltest.ScanConns(t, mysqlEnv.Open(t, "pool-size=2", host.StoreOptions{PoolSize: 1}))
	})

	t.Run("ManyRows", func(t *testing.T) {
		sqltest.ManyRows(t, mysqlEnv.Open(t, "", host.StoreOptions{CallTimeout: sqltest.BigCommitTimeout}))
	})

	t.Run("StatementsPerRun", func(t *testing.T) {
		mysqlStatementsPerRun(t, my, mysqlEnv.Open(t, "", host.StoreOptions{}))
	})

	t.Run("Server", func(t *testing.T) {
		st := mysqlEnv.Open(t, "", host.StoreOptions{})
		servertest.Smoke(t, servertest.Start(t, st, servertest.Options{}))
	})

	t.Run("RefusedConfig", func(t *testing.T) {
		dsn := "dsn=" + my.DSN("")
		sqltest.RefusedConfigs(t, p, my.Addr, []sqltest.RefusedConfig{
			{Name: "no dsn", Config: "table=x", Want: "dsn="},
			{Name: "unknown setting", Config: dsn + " colour=blue", Want: `unknown setting "colour"`},
			{Name: "bad dsn", Config: "dsn=root@" + my.Addr, Want: "dsn:"},
			{Name: "unix socket", Config: "dsn=root@unix(/tmp/sock)/engram", Want: "only tcp"},
			{Name: "no database", Config: "dsn=root@tcp(" + my.Addr + ")/", Want: "no database"},
			{Name: "bad table", Config: dsn + " table=a;drop", Want: "not a plain SQL identifier"},
			{Name: "bad pool size", Config: dsn + " pool-size=1", Want: "pool-size"},
			{Name: "no such database", Config: "dsn=" + my.DSN("nosuchdb"), Want: "nosuchdb"},
			{Name: "no such user", Config: "dsn=nobody@tcp(" + my.Addr + ")/engram", Want: "nobody"},
		}, dsn)
	})

	t.Run("NotAnEngramTable", func(t *testing.T) {
		// Tables that exist but are not Engram's are refused at INIT, not
		// written into: a system table (another engine, other columns),
		// and one with the right names whose key is a case-insensitive
		// VARCHAR that would misorder keys.
		if _, err := my.Exec("", "CREATE TABLE lookalike (internal_key VARCHAR(255) NOT NULL, value LONGBLOB NOT NULL, "+
			"key_head VARBINARY(1024) NOT NULL, key_tail_hash VARBINARY(32) NOT NULL, PRIMARY KEY (key_head, key_tail_hash)) ENGINE=InnoDB"); err != nil {
			t.Fatal(err)
		}
		for _, table := range []string{"mysql.db", "lookalike"} {
			_, err := p.Open(context.Background(), host.StoreOptions{Config: []byte("dsn=" + my.DSN("") + " table=" + table),
				AllowedAddresses: []string{my.Addr}, PoolSize: 1})
			if err == nil || !strings.Contains(err.Error(), "not an Engram table") {
				t.Errorf("Open on %s = %v", table, err)
			}
		}
	})

	t.Run("IdleConnectionsClosed", func(t *testing.T) {
		// KILL ends sessions as wait_timeout or a restart would.
		sqltest.IdleConnectionsClosed(t, mysqlEnv.Open(t, "pool-size=3", host.StoreOptions{PoolSize: 1}), func() error {
			_, err := my.Exec("", "KILL CONNECTION USER 'root'@'127.0.0.1'")
			return err
		})
	})

	t.Run("CommitCuts", func(t *testing.T) {
		// COMMIT is COM_QUERY: command byte 3, then the text.
		table := mysqlEnv.Table()
		sqltest.CommitCuts(t, p, my.Addr, func(addr string) string {
			return "dsn=" + strings.Replace(my.DSN(""), my.Addr, addr, 1) + " table=" + table
		}, "\x03COMMIT")
	})

	t.Run("OppositeOrders", func(t *testing.T) {
		mysqlOppositeOrders(t, my, mysqlEnv.Open(t, "", host.StoreOptions{PoolSize: 4}))
	})

	t.Run("Unavailable", func(t *testing.T) {
		my2 := mysqltest.Start(t)
		sqltest.Unavailable(t, p, "dsn="+my2.DSN("")+" table=gone", my2.Addr, my2.Stop)
	})
}

// mysqlKeyOrder checks the orderings the conformance suite leaves to
// chance here: keys that end in 0x00 or 0x20 (a PAD SPACE collation would
// make "a" and "a " equal), and long keys that share their first 1024
// bytes, which the primary key orders by hash and the plugin must put back
// in key order, forward and reverse, in pages that cut their runs.
func mysqlKeyOrder(t *testing.T, s kv.Store) {
	ctx := context.Background()
	head := bytes.Repeat([]byte{'h'}, 1024)
	long := func(tail string) []byte { return append(bytes.Clone(head), tail...) }
	keys := [][]byte{
		[]byte("a"), []byte("a\x00"), []byte("a\x00\x00"), []byte("a\x1f"), []byte("a "), []byte("a \x00"), []byte("a!"),
		[]byte("b\xff"), bytes.Repeat([]byte{'g'}, 1030),
		head[:1023], head, long("\x00"), long(" "), long("a"), long("b"), long("b\x00"), long("c"),
		long(strings.Repeat("z", 3000)), long(strings.Repeat("z", 3000) + "y"),
		append(bytes.Clone(head[:1023]), 'i'), []byte("z"),
	}
	var ops []kv.Op
	for i, k := range keys {
		ops = append(ops, kv.Put(k, []byte(strconv.Itoa(i))))
	}
	if err := s.Commit(ctx, ops); err != nil {
		t.Fatal(err)
	}
	want := make([][]byte, len(keys))
	copy(want, keys)
	slices.SortFunc(want, bytes.Compare)
	scan := func(o kv.ScanOptions) [][]byte {
		t.Helper()
		it, err := s.Scan(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		defer it.Close()
		var got [][]byte
		for {
			b, err := it.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) == 0 {
				return got
			}
			for _, p := range b {
				got = append(got, bytes.Clone(p.Key))
			}
		}
	}
	check := func(name string, got, want [][]byte) {
		t.Helper()
		if len(got) != len(want) {
			t.Errorf("%s: %d keys, want %d", name, len(got), len(want))
			return
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Errorf("%s: key %d is %.40q (%d bytes), want %.40q (%d bytes)", name, i, got[i], len(got[i]), want[i], len(want[i]))
				return
			}
		}
	}
	reversed := func(ks [][]byte) [][]byte {
		r := make([][]byte, len(ks))
		for i := range ks {
			r[len(ks)-1-i] = ks[i]
		}
		return r
	}
	for _, batch := range []int{1, 2, 3, 5, 100} {
		check(fmt.Sprintf("forward, batches of %d", batch), scan(kv.ScanOptions{BatchSize: batch}), want)
		check(fmt.Sprintf("reverse, batches of %d", batch), scan(kv.ScanOptions{BatchSize: batch, Reverse: true}), reversed(want))
	}
	// Bounds inside a run of shared heads.
	lo, hi := long("b"), long("zz")
	var in [][]byte
	for _, k := range want {
		if bytes.Compare(k, lo) >= 0 && bytes.Compare(k, hi) < 0 {
			in = append(in, k)
		}
	}
	for _, batch := range []int{1, 2, 100} {
		check(fmt.Sprintf("bounded forward, batches of %d", batch), scan(kv.ScanOptions{Start: lo, End: hi, BatchSize: batch}), in)
		check(fmt.Sprintf("bounded reverse, batches of %d", batch), scan(kv.ScanOptions{Start: lo, End: hi, BatchSize: batch, Reverse: true}), reversed(in))
	}
	for i, k := range keys {
		if v, err := s.Get(ctx, k); err != nil || string(v) != strconv.Itoa(i) {
			t.Errorf("Get(%.40q): %q, %v", k, v, err)
		}
	}
	// A key that differs only by a trailing space or NUL is another key.
	if _, err := s.Get(ctx, []byte("b\xff ")); !errors.Is(err, kv.ErrNotFound) {
		t.Errorf(`Get("b\xff "): %v, want not found`, err)
	}
	err := s.Commit(ctx, []kv.Op{kv.CompareAndSwap([]byte("a "), []byte("wrong"), []byte("x"))})
	var ce *kv.ConflictError
	if !errors.As(err, &ce) || !bytes.Equal(ce.Current, []byte("4")) {
		t.Errorf("CAS on \"a \" with a wrong value: %v, want a conflict with its value 4", err)
	}
}

// mysqlOppositeOrders runs concurrent batches that name the same keys in
// opposite orders (and conditional writes on them): the plugin sends each
// batch's statements in key order, so no batch waits for a lock another
// holds while holding one it wants, and InnoDB's deadlock counter stays
// where it was. (Sent in the batches' own order, the same load deadlocked
// about a hundred times.)
func mysqlOppositeOrders(t *testing.T, my *mysqltest.Server, s kv.Store) {
	ctx := context.Background()
	keys := [][]byte{[]byte("k/a"), []byte("k/b"), []byte("k/c"), []byte("k/d")}
	var init []kv.Op
	for _, k := range keys {
		init = append(init, kv.Put(k, []byte("0")))
	}
	if err := s.Commit(ctx, init); err != nil {
		t.Fatal(err)
	}
	deadlocks := func() string {
		out, err := my.Exec("", "SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
		if err != nil || !strings.HasPrefix(out, "Innodb_deadlocks\t") {
			t.Fatalf("reading InnoDB's deadlock counter: %q, %v", out, err)
		}
		return strings.TrimSpace(out)
	}
	before := deadlocks()
	const workers, rounds = 4, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				v := []byte(fmt.Sprintf("%d-%d", w, r))
				var ops []kv.Op
				for i := range keys {
					k := keys[i]
					if w%2 == 1 {
						k = keys[len(keys)-1-i]
					}
					ops = append(ops, kv.Put(k, v))
				}
				if err := s.Commit(ctx, ops); err != nil {
					errs <- fmt.Errorf("worker %d round %d: %w", w, r, err)
					return
				}
				// A conditional batch in the same order: it may lose to
				// another worker (a conflict), never deadlock.
				cur, err := s.Get(ctx, ops[0].Key)
				if err != nil {
					errs <- err
					return
				}
				cond := []kv.Op{kv.CompareAndSwap(ops[0].Key, cur, v), kv.Put(ops[len(ops)-1].Key, v)}
				var ce *kv.ConflictError
				if err := s.Commit(ctx, cond); err != nil && !errors.As(err, &ce) {
					errs <- fmt.Errorf("worker %d round %d (conditional): %w", w, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if after := deadlocks(); after != before {
		t.Errorf("InnoDB deadlocks: %q before, %q after", before, after)
	}
	// Every batch was atomic: the middle keys, which only the
	// unconditional batches write, hold one batch's value.
	b, err1 := s.Get(ctx, keys[1])
	c, err2 := s.Get(ctx, keys[2])
	if err1 != nil || err2 != nil || !bytes.Equal(b, c) {
		t.Errorf("%s holds %q (%v), %s holds %q (%v): a batch was torn", keys[1], b, err1, keys[2], c, err2)
	}
}

// mysqlStatementsPerRun checks, through the server's statement counters,
// that a run of 300 ops of one kind is one statement when every condition
// holds: no fallback to a statement per op (which the results alone would
// not show, since it gives the same answer more slowly).
func mysqlStatementsPerRun(t *testing.T, my *mysqltest.Server, s kv.Store) {
	ctx := context.Background()
	counters := func() map[string]int {
		out, err := my.Exec("", "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_insert', 'Com_update', 'Com_update_multi', 'Com_delete', 'Com_delete_multi', 'Com_rollback')")
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			name, v, _ := strings.Cut(line, "\t")
			m[name], _ = strconv.Atoi(v)
		}
		return m
	}
	key := func(i int) []byte { return fmt.Appendf(nil, "run/%03d", i) }
	for _, c := range []struct {
		name string
		op   func(i int) kv.Op
		want map[string]int
	}{
		{"put-if-absent", func(i int) kv.Op { return kv.PutIfAbsent(key(i), []byte("a")) }, map[string]int{"Com_insert": 1}},
		{"put", func(i int) kv.Op { return kv.Put(key(i), []byte("b")) }, map[string]int{"Com_insert": 1}},
		{"compare-and-swap", func(i int) kv.Op { return kv.CompareAndSwap(key(i), []byte("b"), []byte("c")) }, map[string]int{"Com_update_multi": 1}},
		{"compare-and-delete", func(i int) kv.Op { return kv.CompareAndDelete(key(i), []byte("c")) }, map[string]int{"Com_delete_multi": 1}},
	} {
		var ops []kv.Op
		for i := range 300 {
			ops = append(ops, c.op(i))
		}
		before := counters()
		if err := s.Commit(ctx, ops); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		after := counters()
		for name := range after {
			if d := after[name] - before[name]; d != c.want[name] {
				t.Errorf("%s: %s grew by %d, want %d", c.name, name, d, c.want[name])
			}
		}
	}
}

// BenchmarkMySQL measures mysql.wasm through the host against the shared
// throwaway MariaDB on loopback (durability off), one client: a Get, and
// a commit shaped like Engram's writes (a CAS on the revision key, a new
// object key, a meta put). The README's latencies come from it:
//
//	cd wasm/adaptors && go test -run '^$' -bench BenchmarkMySQL -benchtime 2000x ./mysql
func BenchmarkMySQL(b *testing.B) {
	s := mysqlEnv.Open(b, "", host.StoreOptions{PoolSize: 1})
	sqltest.BenchAdaptor(b, s, &mysqlEnv.BenchSeq)
	sqltest.BenchGroups(b, s, &mysqlEnv.BenchSeq)
}

// TestMySQLGalera runs mysql.wasm against a three-node Galera cluster
// (skipped without MariaDB unless CI is set): the conformance suite on one
// node; every session reads causally (wsrep_sync_wait), so a write through
// one node is read through another at once; a dsn that turns that off is
// refused; and a node that refuses clients (error 1047, as a node without
// quorum answers) is UNAVAILABLE, not INTERNAL, until it serves again.
func TestMySQLGalera(t *testing.T) {
	_, p := mysqlEnv.Setup(t) // the plugin
	cluster := mysqltest.StartGalera(t, 3)
	my := cluster.Nodes[0]
	ctx := context.Background()
	tables := 0
	// open opens a store through node on table (a fresh one if empty).
	open := func(t testing.TB, node int, table, extra string, opts host.StoreOptions) (host.Engine, string) {
		t.Helper()
		if table == "" {
			tables++
			table = fmt.Sprintf("g%d", tables)
		}
		db := cluster.Nodes[node]
		opts.Config = []byte("dsn=" + db.DSN("") + " table=" + table + " " + extra)
		opts.AllowedAddresses = []string{db.Addr}
		if opts.PoolSize == 0 {
			opts.PoolSize = 2
		}
		s, err := p.Open(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s, table
	}

	t.Run("Conformance", func(t *testing.T) {
		kvtest.Run(t, func(t *testing.T) kv.Store {
			s, _ := open(t, 0, "", "", host.StoreOptions{})
			return s
		})
	})

	t.Run("AcrossNodes", func(t *testing.T) {
		// Each write is committed through node 1 and read at once through
		// nodes 2 and 3, which apply it asynchronously: without the wait
		// a read there can miss it.
		writer, table := open(t, 0, "", "", host.StoreOptions{})
		readers := []host.Engine{}
		for _, n := range []int{1, 2} {
			r, _ := open(t, n, table, "", host.StoreOptions{})
			readers = append(readers, r)
		}
		for i := range 200 {
			v := strconv.Itoa(i)
			if err := writer.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte(v))}); err != nil {
				t.Fatal(err)
			}
			for n, r := range readers {
				if got, err := r.Get(ctx, []byte("k")); err != nil || string(got) != v {
					t.Fatalf("write %d through node 1, read through node %d: %q, %v", i, n+2, got, err)
				}
			}
		}
	})

	t.Run("CausalReads", func(t *testing.T) {
		if _, err := my.Exec("", "SET GLOBAL log_output='TABLE'; TRUNCATE mysql.general_log; SET GLOBAL general_log=ON"); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = my.Exec("", "SET GLOBAL general_log=OFF") }()
		s, name := open(t, 0, "", "pool-size=3", host.StoreOptions{PoolSize: 1})
		table := "`" + name + "`"
		if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("a"), nil), kv.Put([]byte("b"), nil), kv.Put([]byte("c"), nil)}); err != nil {
			t.Fatal(err)
		}
		// A scan holds its connection (a snapshot transaction) between
		// batches, so the Get needs another one.
		it, err := s.Scan(ctx, kv.ScanOptions{BatchSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		if b, err := it.Next(ctx); err != nil || len(b) != 1 {
			t.Fatalf("first batch of a scan: %d pairs, %v", len(b), err)
		}
		if _, err := s.Get(ctx, []byte("b")); err != nil {
			t.Fatal(err)
		}
		it.Close()
		out, err := my.Exec("", "SELECT thread_id, REPLACE(REPLACE(CONVERT(argument USING utf8mb4), '\\n', ' '), '\\t', ' ') FROM mysql.general_log WHERE command_type = 'Query' ORDER BY event_time")
		if err != nil {
			t.Fatal(err)
		}
		waits, used := map[string]bool{}, map[string]bool{}
		syncWait := regexp.MustCompile(`\bSET\b.*\bwsrep_sync_wait\s*=\s*1\b`)
		for line := range strings.Lines(out) {
			thread, stmt, _ := strings.Cut(strings.TrimSpace(line), "\t")
			// The plugin's SET on its first connection, and the driver's
			// "SET wsrep_sync_wait = 1, ..." on the ones it opens.
			if syncWait.MatchString(stmt) {
				waits[thread] = true
			}
			if strings.Contains(stmt, table) && !waits[thread] {
				t.Errorf("connection %s used %s without setting wsrep_sync_wait first: %s", thread, table, stmt)
			}
			if strings.Contains(stmt, table) {
				used[thread] = true
			}
		}
		if len(used) < 2 {
			t.Fatalf("the store used %d connections, want at least 2 (the first one and one the driver opened):\n%s", len(used), out)
		}
	})

	t.Run("RefusedSyncWait", func(t *testing.T) {
		for _, v := range []string{"0", "2", "6"} {
			_, err := p.Open(ctx, host.StoreOptions{Config: []byte("dsn=" + my.DSN("") + "?wsrep_sync_wait=" + v + " table=refused"),
				AllowedAddresses: []string{my.Addr}, PoolSize: 1})
			if err == nil || !strings.Contains(err.Error(), "wsrep_sync_wait="+v) {
				t.Errorf("dsn with wsrep_sync_wait=%s: %v, want it refused, naming the setting", v, err)
			}
		}
		s, err := p.Open(ctx, host.StoreOptions{Config: []byte("dsn=" + my.DSN("") + "?wsrep_sync_wait=7 table=accepted"),
			AllowedAddresses: []string{my.Addr}, PoolSize: 1})
		if err != nil {
			t.Fatalf("dsn with wsrep_sync_wait=7: %v", err)
		}
		_ = s.Close()
	})

	t.Run("CompareReplicates", func(t *testing.T) {
		// A compare-and-swap to the value a key holds (a leader's fence)
		// must put the row in the writeset: a transaction whose writeset
		// is empty is not replicated at all, and certification cannot
		// order it against the next leader's rewrite of that row.
		s, _ := open(t, 0, "", "", host.StoreOptions{})
		key, v := []byte("term"), []byte("t1")
		if err := s.Commit(ctx, []kv.Op{kv.Put(key, v)}); err != nil {
			t.Fatal(err)
		}
		committed := func() int {
			out, err := my.Exec("", "SHOW STATUS LIKE 'wsrep_last_committed'")
			if err != nil {
				t.Fatal(err)
			}
			_, n, _ := strings.Cut(strings.TrimSpace(out), "\t")
			seq, err := strconv.Atoi(n)
			if err != nil {
				t.Fatalf("wsrep_last_committed: %q", out)
			}
			return seq
		}
		before := committed()
		if err := s.Commit(ctx, []kv.Op{kv.CompareAndSwap(key, v, v)}); err != nil {
			t.Fatal(err)
		}
		if after := committed(); after != before+1 {
			t.Errorf("a compare alone moved the cluster from write %d to %d, want one replicated write", before, after)
		}
		if got, err := s.Get(ctx, key); err != nil || !bytes.Equal(got, v) {
			t.Errorf("after the compare: %q, %v; want %q", got, err, v)
		}
		// A compare whose condition fails changes nothing and names the
		// value the key holds.
		err := s.Commit(ctx, []kv.Op{kv.CompareAndSwap(key, []byte("t0"), []byte("t0")), kv.Put([]byte("other"), nil)})
		if c, ok := kv.AsConflict(err); !ok || c.Index != 0 || !bytes.Equal(c.Current, v) {
			t.Errorf("a compare that fails: %v, want a conflict of op 0 naming %q", err, v)
		}
		if got, err := s.Get(ctx, key); err != nil || !bytes.Equal(got, v) {
			t.Errorf("after the failed compare: %q, %v; want %q", got, err, v)
		}
	})

	t.Run("NotReady", func(t *testing.T) {
		s, _ := open(t, 0, "", "", host.StoreOptions{PoolSize: 1})
		if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte("v"))}); err != nil {
			t.Fatal(err)
		}
		if _, err := my.Exec("", "SET GLOBAL wsrep_reject_queries=ALL"); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = my.Exec("", "SET GLOBAL wsrep_reject_queries=NONE") }()
		if _, err := s.Get(ctx, []byte("k")); !errors.Is(err, host.ErrUnavailable) || !strings.Contains(err.Error(), "1047") {
			t.Errorf("Get on a node refusing clients: %v, want UNAVAILABLE naming error 1047", err)
		}
		if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte("w"))}); !errors.Is(err, host.ErrUnavailable) {
			t.Errorf("Commit on a node refusing clients: %v, want UNAVAILABLE (refused before COMMIT: a certain failure)", err)
		}
		if _, err := my.Exec("", "SET GLOBAL wsrep_reject_queries=NONE"); err != nil {
			t.Fatal(err)
		}
		if v, err := s.Get(ctx, []byte("k")); err != nil || string(v) != "v" {
			t.Errorf("Get once the node serves again: %q, %v; want the first value", v, err)
		}
	})
}

// mysqlSpace runs the space round on mysql.wasm: defrag must run OPTIMIZE
// TABLE, which the server counts in Com_optimize. The quota is small since
// InnoDB's statistics lag the writes: what refuses the writes is mostly the
// quota's own count of what it admitted since it last measured.
func mysqlSpace(t *testing.T, my *mysqltest.Server) {
	s := mysqlEnv.Open(t, "", host.StoreOptions{})
	optimizes := func() int64 {
		t.Helper()
		out, err := my.Exec("", "SHOW GLOBAL STATUS LIKE 'Com_optimize'")
		n, perr := strconv.ParseInt(strings.TrimPrefix(strings.TrimSpace(out), "Com_optimize\t"), 10, 64)
		if err != nil || perr != nil {
			t.Fatalf("reading Com_optimize: %q, %v", out, err)
		}
		return n
	}
	servertest.SpaceRound(t, s, 256<<10, optimizes)
}
