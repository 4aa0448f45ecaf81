//go:build !etcdref

package backend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/host"
	"github.com/engramkv/engram/internal/mysqltest"
	"github.com/engramkv/engram/internal/proctest"
)

// ENGRAM_K8S_BACKEND=wasm-mysql runs Engram on mysql.wasm: one MariaDB and
// one compiled mysql.wasm per test process (starting MariaDB takes
// seconds, the suite has hundreds of tests); every test gets a store on a
// table of its own, so every test starts from an empty store. The server
// is left running when the process ends; proctest's reaper stops it and
// removes its data.
var (
	myOnce   sync.Once
	myServer *mysqltest.Server
	myPlugin *host.Plugin
	myErr    error
	myTables atomic.Int64
)

// openMySQLStore opens a store on mysql.wasm (path in WasmEnv) backed by a
// fresh table, closed at t.Cleanup (registered before the server's own
// cleanup, so it runs after the server has stopped).
func openMySQLStore(t testing.TB) kv.Store {
	t.Helper()
	path := os.Getenv(WasmEnv)
	if path == "" {
		t.Fatalf("%s=wasm-mysql needs %s=/path/to/mysql.wasm (make adaptors builds bin/mysql.wasm)", BackendEnv, WasmEnv)
	}
	myOnce.Do(func() {
		if myServer, myErr = mysqltest.Launch(); myErr != nil {
			return
		}
		var cache string
		if cache, myErr = proctest.WasmCacheDir(path); myErr != nil {
			return
		}
		myPlugin, myErr = host.Load(context.Background(), path, host.Options{CacheDir: cache})
	})
	if errors.Is(myErr, mysqltest.ErrNotInstalled) && os.Getenv("CI") == "" {
		t.Skipf("%s=wasm-mysql: %v", BackendEnv, myErr)
	}
	if myErr != nil {
		t.Fatalf("%s=wasm-mysql: %v", BackendEnv, myErr)
	}
	cfg := fmt.Sprintf("dsn=%s table=k8s_%d pool-size=4", myServer.DSN(""), myTables.Add(1))
	st, err := myPlugin.Open(context.Background(), host.StoreOptions{Config: []byte(cfg), AllowedAddresses: []string{myServer.Addr}, PoolSize: 4})
	if err != nil {
		t.Fatalf("opening %s: %v", path, err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
			t.Errorf("closing the mysql.wasm store: %v", err)
		}
	})
	return st
}
