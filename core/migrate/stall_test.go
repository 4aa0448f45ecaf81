package migrate_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/engramkv/engram/core/migrate"
	"github.com/engramkv/engram/internal/stallproxy"
)

// TestBaseStall cuts the source off mid-base (a proxy that stops
// forwarding but keeps the connection open, as a partition does): the
// snapshot download and the paginated Range each end with ErrSourceIdle
// after the idle timeout instead of hanging, and leave the store empty.
func TestBaseStall(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, time.Minute)
	e, src := startSource(t)
	// Enough data that the stall falls inside the base: 2 MiB of values.
	val := strings.Repeat("v", 64<<10)
	for i := range 32 {
		if _, err := src.Put(ctx, "/big/"+string(rune('a'+i%26))+string(rune('a'+i/26)), val); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range []migrate.BaseMode{migrate.BaseSnapshot, migrate.BaseRange} {
		t.Run(string(mode), func(t *testing.T) {
			proxy := stallproxy.Start(t, strings.TrimPrefix(e.Endpoint, "http://"))
			// Past the connection's set-up and the first calls, short of
			// the base's 2 MiB.
			proxy.StallAfter(512 << 10)
			c := dial(t, "http://"+proxy.Addr)
			st := openBadger(t, "")
			var logs logBuffer
			const idle = 500 * time.Millisecond
			ch := runAsync(ctx, migrate.Options{Client: c, Source: e.Endpoint, Store: st, TempDir: t.TempDir(), Logger: logs.logger(),
				Base: mode, IdleTimeout: idle, PageSize: 4}, closed())
			// Bounded well past the idle timeout: without it the
			// migration waits for the silent source until ctx ends.
			r := waitRun(t, ch, 20*time.Second)
			select {
			case <-proxy.Stalled():
			default:
				t.Fatalf("the proxy never stalled (the base was smaller than the budget): %v", r.err)
			}
			if !errors.Is(r.err, migrate.ErrSourceIdle) {
				t.Fatalf("migrate.Run with a stalled source: %v, want ErrSourceIdle\nlog:\n%s", r.err, logs.String())
			}
			t.Logf("refused: %v", r.err)
			if err := mvccCheckEmpty(ctx, st); err != nil {
				t.Fatalf("a stalled base left something in the store: %v", err)
			}
		})
	}
}
