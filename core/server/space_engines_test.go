package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/engines/pebble"
	"github.com/engramkv/engram/internal/etcdtest"
)

// TestSpaceRoundOnNativeEngines runs the operator's round on space
// (servertest.CheckSpace: Status's DbSize, the size metric, NOSPACE
// through etcdctl) and then `etcdctl defrag` on the compiled-in engines
// that the badger and TiKV tests do not cover: pebble (its files) and
// memkv (the bytes it holds). The wasm engines run it in wasm/host/.
func TestSpaceRoundOnNativeEngines(t *testing.T) {
	t.Parallel()
	etcdtest.Require(t)
	for _, e := range []struct {
		name string
		open func(t *testing.T) kv.Store
	}{
		{"memkv", func(t *testing.T) kv.Store { return memkv.New() }},
		{"pebble", func(t *testing.T) kv.Store {
			s, err := pebble.Open(pebble.Options{Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}},
	} {
		t.Run(e.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
			defer cancel()
			s := e.open(t)
			t.Cleanup(func() { _ = s.Close() })
			reg := prometheus.NewRegistry()
			srv := servertest.Start(t, s, servertest.Options{QuotaBackendBytes: 2 << 20, Registerer: reg})
			servertest.CheckSpace(t, ctx, srv, reg)
			if out := srv.Etcdctl(t, "defrag"); !strings.Contains(out, "Finished defragmenting etcd member") {
				t.Errorf("etcdctl defrag: %q", out)
			}
		})
	}
}
