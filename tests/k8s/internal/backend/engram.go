//go:build !etcdref

package backend

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/engines/pebble"
	"github.com/engramkv/engram/wasm/host"
)

const backendName = "engram"

// BackendEnv selects Engram's storage engine for the suite: empty for the
// built-in in-memory store, "badger" for the default embedded engine on
// disk, "pebble" for the other embedded engine on disk, "wasm-memkv" for the memkv.wasm test plugin run
// by the wasm host (its path in WasmEnv), so the whole suite also checks
// Engram on a WebAssembly storage plugin, "wasm-postgres" for postgres.wasm
// (its path in WasmEnv) on a throwaway PostgreSQL with a table per test
// (postgres.go), "wasm-mysql" likewise for mysql.wasm on a throwaway
// MariaDB (mysql.go), "wasm-galera" for mysql.wasm on a throwaway
// three-node Galera cluster (galera.go), "tikv" for the TiKV adaptor on a fresh in-process mock
// TiKV cluster per test (tikv.go), and "migrated" for badger stores
// migrated from a real etcd by core/migrate (migrated.go).
const (
	BackendEnv = "ENGRAM_K8S_BACKEND"
	WasmEnv    = "ENGRAM_K8S_WASM"
)

// closedAfter closes st when t ends. Registered before the server's own
// cleanup, it runs after the server has stopped.
func closedAfter(t testing.TB, name string, st kv.Store) kv.Store {
	t.Cleanup(func() {
		if err := st.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
			t.Errorf("closing %s: %v", name, err)
		}
	})
	return st
}

// startServer starts a fresh Engram on 127.0.0.1 (random port), stopped by
// t.Cleanup, and returns the address to dial.
func startServer(t testing.TB) string {
	t.Helper()
	var store kv.Store
	switch b := os.Getenv(BackendEnv); b {
	case "":
		store = closedAfter(t, "memkv", memkv.New())
	case "wasm-postgres": // postgres.go
		store = openPostgresStore(t)
	case "wasm-mysql": // mysql.go
		store = openMySQLStore(t)
	case "wasm-galera": // galera.go
		store = openGaleraStore(t)
	case "wasm-memkv":
		store = closedAfter(t, "the wasm store", openWasmStore(t))
	case "tikv":
		store = openTiKVStore(t)
	case "migrated":
		store = openMigratedStore(t)
	case "badger":
		// The default engine of `engram serve`, on disk with every write
		// fsynced, one directory per test.
		st, err := badger.Open(badger.Options{Dir: t.TempDir()})
		if err != nil {
			t.Fatalf("opening badger: %v", err)
		}
		store = closedAfter(t, "badger", st)
	case "pebble":
		st, err := pebble.Open(pebble.Options{Dir: t.TempDir()})
		if err != nil {
			t.Fatalf("opening pebble: %v", err)
		}
		store = closedAfter(t, "pebble", st)
	default:
		t.Fatalf("%s=%q: unknown backend (want empty, badger, pebble, wasm-memkv, wasm-postgres, wasm-mysql, wasm-galera, tikv or migrated)", BackendEnv, b)
	}
	return servertest.Start(t, store, servertest.Options{ProgressNotifyInterval: ProgressNotifyInterval}).Endpoint
}

// The plugin is compiled once per test process; every test gets a fresh
// store (a fresh instance, so an empty memkv) on it.
var (
	wasmOnce   sync.Once
	wasmPlugin *host.Plugin
	wasmErr    error
)

func openWasmStore(t testing.TB) kv.Store {
	t.Helper()
	path := os.Getenv(WasmEnv)
	if path == "" {
		t.Fatalf("%s=wasm-memkv needs %s=/path/to/memkv.wasm (make plugins builds wasm/testplugins/bin/memkv.wasm)", BackendEnv, WasmEnv)
	}
	wasmOnce.Do(func() {
		cache := filepath.Join(os.TempDir(), "engram-k8s-wasm-cache")
		wasmPlugin, wasmErr = host.Load(context.Background(), path, host.Options{CacheDir: cache})
	})
	if wasmErr != nil {
		t.Fatalf("loading %s: %v", path, wasmErr)
	}
	st, err := wasmPlugin.Open(context.Background(), host.StoreOptions{})
	if err != nil {
		t.Fatalf("opening %s: %v", path, err)
	}
	return st
}
