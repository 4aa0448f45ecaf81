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
	"github.com/engramkv/engram/internal/pgtest"
)

// ENGRAM_K8S_BACKEND=wasm-postgres runs Engram on postgres.wasm: one PostgreSQL and one compiled
// postgres.wasm per test process (starting PostgreSQL takes seconds, the
// suite has hundreds of tests); every test gets a store on a table of its
// own, so every test starts from an empty store. The server is left running
// when the process ends; pgtest's reaper stops it and removes its data.
var (
	pgOnce   sync.Once
	pgServer *pgtest.Server
	pgPlugin *host.Plugin
	pgErr    error
	pgTables atomic.Int64
)

// openPostgresStore opens a store on postgres.wasm (path in WasmEnv) backed
// by a fresh table, closed at t.Cleanup (registered before the server's own
// cleanup, so it runs after the server has stopped).
func openPostgresStore(t testing.TB) kv.Store {
	t.Helper()
	path := os.Getenv(WasmEnv)
	if path == "" {
		t.Fatalf("%s=wasm-postgres needs %s=/path/to/postgres.wasm (make adaptors builds bin/postgres.wasm)", BackendEnv, WasmEnv)
	}
	pgOnce.Do(func() {
		pgServer, pgErr = pgtest.Launch()
		if pgErr != nil {
			return
		}
		var cache string
		if cache, pgErr = pgtest.WasmCacheDir(path); pgErr != nil {
			return
		}
		pgPlugin, pgErr = host.Load(context.Background(), path, host.Options{CacheDir: cache})
	})
	if errors.Is(pgErr, pgtest.ErrNotInstalled) && os.Getenv("CI") == "" {
		t.Skipf("%s=wasm-postgres: %v", BackendEnv, pgErr)
	}
	if pgErr != nil {
		t.Fatalf("%s=wasm-postgres: %v", BackendEnv, pgErr)
	}
	cfg := fmt.Sprintf("url=%s table=k8s_%d pool-size=4", pgServer.URL(""), pgTables.Add(1))
	st, err := pgPlugin.Open(context.Background(), host.StoreOptions{Config: []byte(cfg), AllowedAddresses: []string{pgServer.Addr}, PoolSize: 4})
	if err != nil {
		t.Fatalf("opening %s: %v", path, err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
			t.Errorf("closing the postgres.wasm store: %v", err)
		}
	})
	return st
}
