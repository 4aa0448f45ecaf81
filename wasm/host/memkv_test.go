package host

import (
	"context"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvtest"
)

// TestConformanceMemKV runs the adaptor conformance suite against
// memkv.wasm through the host: every case gets a fresh instance.
func TestConformanceMemKV(t *testing.T) {
	p := loadPlugin(t, "memkv", Options{})
	kvtest.Run(t, func(t *testing.T) kv.Store {
		s, err := p.Open(context.Background(), StoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
