//go:build !etcdref

package backend

import (
	"sync/atomic"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/internal/mysqltest"
)

// galeraBackend is ENGRAM_K8S_BACKEND=wasm-galera: Engram on mysql.wasm and
// a throwaway three-node MariaDB Galera cluster. Each test's store goes
// through the next node in turn, so the suite writes and reads through all
// three (certification, causal reads).
var galeraBackend = &wasmSQL[*mysqltest.Cluster]{
	name:         "wasm-galera",
	file:         "mysql.wasm",
	launch:       func() (*mysqltest.Cluster, error) { return mysqltest.LaunchGalera(3) },
	notInstalled: mysqltest.ErrNotInstalled,
	config: func(c *mysqltest.Cluster, table string) (string, string) {
		s := c.Nodes[galeraTurn.Add(1)%int64(len(c.Nodes))]
		return "dsn=" + s.DSN("") + " table=" + table, s.Addr
	},
}

// galeraTurn picks the node of the next store.
var galeraTurn atomic.Int64

func openGaleraStore(t testing.TB) kv.Store { return galeraBackend.open(t) }
