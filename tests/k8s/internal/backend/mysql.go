//go:build !etcdref

package backend

import (
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/internal/mysqltest"
)

// mysqlBackend is ENGRAM_K8S_BACKEND=wasm-mysql: Engram on mysql.wasm and
// a throwaway MariaDB.
var mysqlBackend = &wasmSQL[*mysqltest.Server]{
	name:         "wasm-mysql",
	file:         "mysql.wasm",
	launch:       mysqltest.Launch,
	notInstalled: mysqltest.ErrNotInstalled,
	config: func(s *mysqltest.Server, table string) (string, string) {
		return "dsn=" + s.DSN("") + " table=" + table, s.Addr
	},
}

func openMySQLStore(t testing.TB) kv.Store { return mysqlBackend.open(t) }
