package warmwasm

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/engramkv/engram/internal/proctest"
	"github.com/engramkv/engram/wasm/host"
)

// TestWarm compiles each plugin named in ENGRAM_WARM_WASM (paths separated
// by spaces) into its shared cache; without the variable there is nothing
// to do.
func TestWarm(t *testing.T) {
	files := strings.Fields(os.Getenv("ENGRAM_WARM_WASM"))
	if len(files) == 0 {
		t.Skip("ENGRAM_WARM_WASM names no plugin")
	}
	for _, path := range files {
		dir, err := proctest.WasmCacheDir(path)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		p, err := host.Load(context.Background(), path, host.Options{CacheDir: dir, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if err := p.Close(context.Background()); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		t.Logf("%s in %s (%s)", path, dir, time.Since(start).Round(time.Millisecond))
	}
}
