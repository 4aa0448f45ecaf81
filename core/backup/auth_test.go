package backup_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/engramkv/engram/core/backup"
	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/internal/etcdtest"
)

// authChecks is what an operator checks after moving a store that has auth
// on: who may read and write what, with the passwords they had, and the
// users, roles and auth status as etcdctl prints them.
var authChecks = [][]string{
	{"get", "/app/x"},
	{"--user=root:rp", "get", "/other"},
	{"--user=alice:ap", "get", "/app/x"},
	{"--user=alice:ap", "get", "/other"},
	{"--user=alice:ap", "put", "/app/x", "2"},
	{"--user=alice:ap", "put", "/app/w", "3"},
	{"--user=alice:wrong", "get", "/app/x"},
	{"--user=carol:any", "get", "/app/x"},
	{"--user=root:rp", "user", "list"},
	{"--user=root:rp", "user", "get", "alice"},
	{"--user=root:rp", "user", "get", "carol"},
	{"--user=root:rp", "role", "list"},
	{"--user=root:rp", "role", "get", "reader"},
	{"--user=root:rp", "role", "get", "writer"},
	{"--user=root:rp", "auth", "status", "-w", "json"},
}

// sameAnswers runs authChecks against both endpoints and reports each
// difference.
func sameAnswers(t *testing.T, what string, want, got string) {
	t.Helper()
	for _, c := range authChecks {
		w, g := etcdtest.EtcdctlComparable(t, want, c...), etcdtest.EtcdctlComparable(t, got, c...)
		if w != g {
			t.Errorf("%s: etcdctl %v:\n  etcd:   %s\n  engram: %s", what, c, w, g)
		}
	}
}

// TestAuthTravelsWithSnapshots: users, roles, permissions, a certificate-
// only user and auth enable, set up with etcdctl on etcd 3.6, come into
// Engram with the snapshot (`etcdctl snapshot save` as root, then Restore)
// and every check answers as on the source; Engram's own snapshot taken
// the same way, restored into a fresh etcd with etcdutl, answers the same
// again, passwords included (both keep etcd's bcrypt hashes).
func TestAuthTravelsWithSnapshots(t *testing.T) {
	// A low bcrypt cost keeps the password checks cheap under the race
	// detector; the hashes travel with their cost.
	cheap := []string{"--bcrypt-cost=4"}
	src := etcdtest.Start(t, etcdtest.Options{Args: cheap})
	for _, s := range [][]string{
		{"user", "add", "root", "--new-user-password=rp"},
		{"user", "add", "alice", "--new-user-password=ap"},
		{"user", "add", "carol", "--no-password"},
		{"role", "add", "reader"},
		{"role", "grant-permission", "reader", "read", "/app/", "--prefix"},
		{"role", "add", "writer"},
		{"role", "grant-permission", "writer", "readwrite", "/app/w"},
		{"user", "grant-role", "alice", "reader"},
		{"user", "grant-role", "alice", "writer"},
		{"user", "grant-role", "carol", "reader"},
		{"user", "grant-role", "root", "root"},
		{"put", "/app/x", "1"},
		{"put", "/other", "2"},
		{"auth", "enable"},
	} {
		if out, err := src.Etcdctl(t, s...); err != nil {
			t.Fatalf("etcdctl %v: %v\n%s", s, err, out)
		}
	}
	file := filepath.Join(t.TempDir(), "etcd.db")
	if out, err := src.Etcdctl(t, "--user=root:rp", "snapshot", "save", file); err != nil {
		t.Fatalf("etcdctl snapshot save: %v\n%s", err, out)
	}

	st, err := badger.Open(badger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	info, err := backup.Restore(context.Background(), st, file, backup.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Auth == nil || !info.Auth.Enabled || len(info.Auth.Users) != 3 || len(info.Auth.Roles) != 2 {
		t.Fatalf("restore reports auth %+v, want enabled with 3 users and 2 roles (etcd keeps no record of the root role)", info.Auth)
	}
	eng := servertest.Start(t, st, servertest.Options{Auth: server.AuthOptions{BcryptCost: 4}})
	sameAnswers(t, "etcd's snapshot restored into Engram", src.Endpoint, eng.Endpoint)

	file2 := filepath.Join(t.TempDir(), "engram.db")
	if out, err := etcdtest.Etcdctl(t, "--endpoints="+eng.Endpoint, "--user=root:rp", "snapshot", "save", file2); err != nil {
		t.Fatalf("etcdctl snapshot save against Engram: %v\n%s", err, out)
	}
	back := etcdtest.Start(t, etcdtest.Options{DataDir: etcdtest.Restore(t, file2), Args: cheap})
	sameAnswers(t, "Engram's snapshot restored into etcd", src.Endpoint, back.Endpoint)
}
