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
	"github.com/engramkv/engram/internal/proctest"
	"github.com/engramkv/engram/wasm/host"
)

// wasmSQL is a backend that runs Engram on a SQL adaptor (its .wasm path
// in WasmEnv) backed by a throwaway database server: one server and one
// compiled plugin per test process (starting a server takes seconds, the
// suite has hundreds of tests); every test gets a store on a table of its
// own, so every test starts from an empty store. The server is left
// running when the process ends; proctest's reaper stops it and removes
// its data.
type wasmSQL[S any] struct {
	name         string // the backend, as in BackendEnv
	file         string // the plugin's file name, as make adaptors builds it
	launch       func() (S, error)
	notInstalled error
	// config is the plugin's configuration for table on server, and the
	// address it must be allowed to dial.
	config func(server S, table string) (cfg, addr string)

	once   sync.Once
	server S
	plugin *host.Plugin
	err    error
	tables atomic.Int64
}

// open opens a store backed by a fresh table, closed at t.Cleanup
// (registered before the server's own cleanup, so it runs after the
// server has stopped).
func (w *wasmSQL[S]) open(t testing.TB) kv.Store {
	t.Helper()
	path := os.Getenv(WasmEnv)
	if path == "" {
		t.Fatalf("%s=%s needs %s=/path/to/%s (make adaptors builds bin/%s)", BackendEnv, w.name, WasmEnv, w.file, w.file)
	}
	w.once.Do(func() {
		if w.server, w.err = w.launch(); w.err != nil {
			return
		}
		var cache string
		if cache, w.err = proctest.WasmCacheDir(path); w.err != nil {
			return
		}
		w.plugin, w.err = host.Load(context.Background(), path, host.Options{CacheDir: cache})
	})
	if errors.Is(w.err, w.notInstalled) && os.Getenv("CI") == "" {
		t.Skipf("%s=%s: %v", BackendEnv, w.name, w.err)
	}
	if w.err != nil {
		t.Fatalf("%s=%s: %v", BackendEnv, w.name, w.err)
	}
	cfg, addr := w.config(w.server, fmt.Sprintf("k8s_%d", w.tables.Add(1)))
	st, err := w.plugin.Open(context.Background(), host.StoreOptions{Config: []byte(cfg + " pool-size=4"), AllowedAddresses: []string{addr}, PoolSize: 4})
	if err != nil {
		t.Fatalf("opening %s: %v", path, err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
			t.Errorf("closing the %s store: %v", w.file, err)
		}
	})
	return st
}
