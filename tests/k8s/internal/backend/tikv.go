//go:build !etcdref

package backend

import (
	"errors"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/tikv/tikvmock"
)

// openTiKVStore returns Engram's TiKV adaptor over a fresh in-process mock
// TiKV cluster (client-go's mock: PD, ten regions, TiKV's transactional
// MVCC in memory), closed after the test's server has stopped. Every
// request of the suite then goes through the adaptor's snapshot scans,
// optimistic transactions and error mapping.
func openTiKVStore(t testing.TB) kv.Store {
	t.Helper()
	st, err := tikvmock.Open(tikvmock.Options{})
	if err != nil {
		t.Fatalf("opening a mock TiKV store: %v", err)
	}
	// Registered before the server's own cleanup, so it runs after the
	// server has stopped.
	t.Cleanup(func() {
		if err := st.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
			t.Errorf("closing the TiKV store: %v", err)
		}
	})
	return st
}
