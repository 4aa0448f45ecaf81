package host

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/engramkv/engram/internal/proctest"
)

// pluginPath returns a plugin built by the Makefile: a test fixture from
// wasm/testplugins/bin (`make plugins`) or a shipped adaptor from bin/ (`make
// adaptors`).
func pluginPath(t testing.TB, name string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	fixture := filepath.Join(root, "wasm", "testplugins", "bin", name+".wasm")
	adaptor := filepath.Join(root, "bin", name+".wasm")
	for _, p := range []string{fixture, adaptor} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatalf("neither %s nor %s exists: build them with `make plugins adaptors`", fixture, adaptor)
	return ""
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// loadPlugin loads a test plugin, closed at cleanup.
func loadPlugin(t testing.TB, name string, opts Options) *Plugin {
	t.Helper()
	path := pluginPath(t, name)
	if opts.CacheDir == "" {
		// The cache shared with the other test processes of the run, which
		// `make test` fills before the race-detector tests (package
		// warmwasm): compiling under the detector is several times slower.
		dir, err := proctest.WasmCacheDir(path)
		if err != nil {
			t.Fatal(err)
		}
		opts.CacheDir = dir
	}
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	p, err := Load(context.Background(), path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}
