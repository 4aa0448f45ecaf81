//go:build !wasip1

package main

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvtest"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/internal/pgtest"
	"github.com/engramkv/engram/wasm/adaptors/internal/sqltest"
	"github.com/engramkv/engram/wasm/host"
)

// postgresEnv is the PostgreSQL and postgres.wasm of TestPostgres and
// BenchmarkPostgres.
var postgresEnv = &sqltest.Env[*pgtest.Server]{
	Plugin:       "postgres",
	Launch:       pgtest.Launch,
	NotInstalled: pgtest.ErrNotInstalled,
	Config: func(s *pgtest.Server) (string, string) {
		return "url=" + s.URL(""), s.Addr
	},
}

// TestPostgres runs postgres.wasm against a throwaway PostgreSQL (skipped
// without PostgreSQL binaries unless CI is set): the conformance suite, the
// whole server through clientv3, refused configurations, connections the
// server ends while idle, commits cut around COMMIT, and a server that
// goes away.
func TestPostgres(t *testing.T) {
	pg, p := postgresEnv.Setup(t)
	t.Logf("PostgreSQL %s on %s", pg.Version, pg.Addr)

	t.Run("Conformance", func(t *testing.T) {
		kvtest.Run(t, func(t *testing.T) kv.Store { return postgresEnv.Open(t, "", host.StoreOptions{}) })
	})

	t.Run("Space", func(t *testing.T) { postgresSpace(t, pg) })

	t.Run("Manifest", func(t *testing.T) {
		s := postgresEnv.Open(t, "pool-size=2", host.StoreOptions{})
		m, f := s.Manifest(), s.Features()
		if m.Name != "postgres" || m.Model.String() != "pooled" || !f.Durable {
			t.Errorf("manifest %+v, features %+v", m, f)
		}
	})

	t.Run("ScanConnections", func(t *testing.T) {
		sqltest.ScanConns(t, postgresEnv.Open(t, "pool-size=2", host.StoreOptions{PoolSize: 1}))
	})

	t.Run("ManyRows", func(t *testing.T) {
		sqltest.ManyRows(t, postgresEnv.Open(t, "", host.StoreOptions{CallTimeout: sqltest.BigCommitTimeout}))
	})

	t.Run("Server", func(t *testing.T) {
		st := postgresEnv.Open(t, "", host.StoreOptions{})
		servertest.Smoke(t, servertest.Start(t, st, servertest.Options{}))
	})

	t.Run("RefusedConfig", func(t *testing.T) {
		url := "url=" + pg.URL("")
		sqltest.RefusedConfigs(t, p, pg.Addr, []sqltest.RefusedConfig{
			{Name: "no url", Config: "table=x", Want: "url=postgres://"},
			{Name: "unknown setting", Config: url + " colour=blue", Want: `unknown setting "colour"`},
			{Name: "bad url", Config: "url=mysql://" + pg.Addr, Want: "url:"},
			{Name: "bad table", Config: url + ` table=a;drop`, Want: "not a plain SQL identifier"},
			{Name: "bad pool size", Config: url + " pool-size=1", Want: "pool-size"},
			{Name: "no such database", Config: "url=" + pg.URL("nosuchdb"), Want: "nosuchdb"},
		}, url)
	})

	t.Run("NotAnEngramTable", func(t *testing.T) {
		// A table that exists with other columns is refused at INIT, not
		// written into. pg_class is a view-free catalog table every
		// database has.
		_, err := p.Open(context.Background(), host.StoreOptions{Config: []byte("url=" + pg.URL("") + " table=pg_catalog.pg_class"),
			AllowedAddresses: []string{pg.Addr}, PoolSize: 1})
		if err == nil || !strings.Contains(err.Error(), "not an Engram table") {
			t.Errorf("Open on pg_class = %v", err)
		}
	})

	t.Run("IdleConnectionsClosed", func(t *testing.T) {
		// pg_terminate_backend ends sessions as idle_session_timeout, a
		// restart or a proxy would.
		sqltest.IdleConnectionsClosed(t, postgresEnv.Open(t, "pool-size=3", host.StoreOptions{PoolSize: 1}), func() error {
			_, err := pg.Exec("", `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`)
			return err
		})
	})

	t.Run("CommitCuts", func(t *testing.T) {
		// COMMIT is a simple-protocol query: its text, NUL-terminated.
		table := postgresEnv.Table()
		sqltest.CommitCuts(t, p, pg.Addr, func(addr string) string {
			return "url=" + strings.Replace(pg.URL(""), pg.Addr, addr, 1) + " table=" + table
		}, "COMMIT\x00")
	})

	t.Run("Unavailable", func(t *testing.T) {
		pg2 := pgtest.Start(t)
		sqltest.Unavailable(t, p, "url="+pg2.URL("")+" table=gone", pg2.Addr, pg2.Stop)
	})
}

// BenchmarkPostgres measures postgres.wasm through the host against the
// shared throwaway PostgreSQL on loopback (durability off), one client: a
// Get, and a commit shaped like Engram's writes (a CAS on the revision
// key, a new object key, a meta put).
//
//	cd wasm/adaptors && go test -run '^$' -bench BenchmarkPostgres -benchtime 2000x ./postgres
func BenchmarkPostgres(b *testing.B) {
	s := postgresEnv.Open(b, "", host.StoreOptions{PoolSize: 1})
	sqltest.BenchAdaptor(b, s, &postgresEnv.BenchSeq)
	sqltest.BenchGroups(b, s, &postgresEnv.BenchSeq)
}

// postgresSpace runs the space round (servertest.SpaceRound) on postgres.wasm: the
// quota is measured with pg_total_relation_size, and defrag must VACUUM
// the store's table, which PostgreSQL counts in pg_stat_user_tables.
func postgresSpace(t *testing.T, pg *pgtest.Server) {
	s, table := postgresEnv.OpenTable(t, "", host.StoreOptions{})
	vacuums := func() int64 {
		t.Helper()
		out, err := pg.Exec("", "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = '"+table+"'")
		n, perr := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
		if err != nil || perr != nil {
			t.Fatalf("reading the vacuum count of %s: %q, %v", table, out, err)
		}
		return n
	}
	servertest.SpaceRound(t, s, 1<<20, vacuums)
}
