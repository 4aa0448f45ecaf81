package server_test

import (
	"testing"

	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/etcdtest"
)

// TestAuthEtcdctl runs an operator's etcdctl 3.6 session against etcd 3.6
// and Engram and compares what etcdctl prints: users, a role with a
// prefix, auth enable, gets as root and as a restricted user (allowed and
// refused), auth status and auth disable.
func TestAuthEtcdctl(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t, etcdtest.Options{})
	g := servertest.Start(t, memkv.New(), servertest.Options{Auth: server.AuthOptions{BcryptCost: 4}})
	steps := [][]string{
		{"user", "add", "root", "--new-user-password=rp"},
		{"user", "add", "alice", "--new-user-password=ap"},
		{"role", "add", "reader"},
		{"role", "grant-permission", "reader", "read", "/app/", "--prefix"},
		{"role", "get", "reader"},
		{"user", "grant-role", "alice", "reader"},
		{"user", "grant-role", "root", "root"},
		{"put", "/app/x", "1"},
		{"put", "/other", "2"},
		{"auth", "enable"},
		{"get", "/app/x"},
		{"--user=root:rp", "get", "/app/x"},
		{"--user=alice:ap", "get", "/app/x"},
		{"--user=alice:ap", "get", "/other"},
		{"--user=alice:ap", "put", "/app/x", "2"},
		{"--user=alice:wrong", "get", "/app/x"},
		{"--user=alice:ap", "user", "list"},
		{"--user=root:rp", "user", "list"},
		{"--user=root:rp", "user", "get", "alice"},
		{"--user=root:rp", "auth", "status", "-w", "json"},
		{"--user=root:rp", "auth", "disable"},
		{"get", "/other"},
		{"auth", "status", "-w", "json"},
	}
	for _, s := range steps {
		want, got := etcdtest.EtcdctlComparable(t, e.Endpoint, s...), etcdtest.EtcdctlComparable(t, g.Endpoint, s...)
		if want != got {
			t.Errorf("etcdctl %v:\n  etcd:   %s\n  engram: %s", s, want, got)
		}
	}
}
