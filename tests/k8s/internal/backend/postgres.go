//go:build !etcdref

package backend

import (
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/internal/pgtest"
)

// postgresBackend is ENGRAM_K8S_BACKEND=wasm-postgres: Engram on
// postgres.wasm and a throwaway PostgreSQL.
var postgresBackend = &wasmSQL[*pgtest.Server]{
	name:         "wasm-postgres",
	file:         "postgres.wasm",
	launch:       pgtest.Launch,
	notInstalled: pgtest.ErrNotInstalled,
	config: func(s *pgtest.Server, table string) (string, string) {
		return "url=" + s.URL("") + " table=" + table, s.Addr
	},
}

func openPostgresStore(t testing.TB) kv.Store { return postgresBackend.open(t) }
