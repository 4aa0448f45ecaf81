//go:build !etcdref

package backend

import (
	"testing"

	"github.com/engramkv/engram/core/server/servertest"
)

const backendName = "engram"

// startServer starts a fresh in-memory Engram on 127.0.0.1 (random port),
// stopped by t.Cleanup, and returns the address to dial.
func startServer(t testing.TB) string {
	t.Helper()
	return servertest.Start(t, servertest.Options{ProgressNotifyInterval: ProgressNotifyInterval}).Endpoint
}
