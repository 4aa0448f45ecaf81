package snapshot

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/authpb"
	"google.golang.org/protobuf/proto"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/internal/etcdtest"
)

func testAuth() *Auth {
	return &Auth{
		Enabled:  true,
		Revision: 7,
		Users: []*authpb.User{
			{Name: []byte("root"), Password: []byte("$2a$04$hash-of-root"), Roles: []string{"root"}},
			{Name: []byte("alice"), Password: []byte("$2a$04$hash-of-alice"), Roles: []string{"reader", "writer"}},
			{Name: []byte("carol"), Roles: []string{"reader"}, Options: &authpb.UserAddOptions{NoPassword: true}},
		},
		Roles: []*authpb.Role{
			{Name: []byte("root")},
			{Name: []byte("reader"), KeyPermission: []*authpb.Permission{{PermType: authpb.READ, Key: []byte("/app/"), RangeEnd: []byte("/app0")}}},
			{Name: []byte("writer"), KeyPermission: []*authpb.Permission{{PermType: authpb.READWRITE, Key: []byte("/app/w")}}},
		},
	}
}

// sameAuth compares two auth states record by record.
func sameAuth(t *testing.T, got, want *Auth) {
	t.Helper()
	if got.Enabled != want.Enabled || got.Revision != want.Revision {
		t.Errorf("auth enabled %v at revision %d, want enabled %v at %d", got.Enabled, got.Revision, want.Enabled, want.Revision)
	}
	records := func(a *Auth) map[string]proto.Message {
		m := map[string]proto.Message{}
		for _, u := range a.Users {
			m["user "+string(u.Name)] = u
		}
		for _, r := range a.Roles {
			m["role "+string(r.Name)] = r
		}
		return m
	}
	g, w := records(got), records(want)
	if len(g) != len(w) {
		t.Errorf("%d users and roles, want %d", len(g), len(w))
	}
	for name, rec := range w {
		if !proto.Equal(g[name], rec) {
			t.Errorf("%s = %v, want %v", name, g[name], rec)
		}
	}
}

// TestAuthRoundTrip: the auth state Write puts in a file is what Auth reads
// back, and the file's Info still agrees with a fresh scan (the auth
// buckets are hashed in their place, before "key").
func TestAuthRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "snap.db")
	want := testAuth()
	rows := []etcdfmt.Entry{{Rev: etcdfmt.Revision{Main: 2}, KV: kv("a", 2, 2, 1, "x")}}
	winfo, err := Write(t.Context(), path, WriteOptions{Auth: want}, feed(rows))
	if err != nil {
		t.Fatal(err)
	}
	f, err := Open(path, OpenOptions{SkipHashCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Info() != winfo {
		t.Errorf("Open's Info %+v, Write's %+v", f.Info(), winfo)
	}
	got, err := f.Auth()
	if err != nil {
		t.Fatal(err)
	}
	sameAuth(t, got, want)

	// Without auth, no auth bucket is written, and Auth reads as Empty.
	plain := filepath.Join(t.TempDir(), "plain.db")
	if _, err := Write(t.Context(), plain, WriteOptions{}, feed(rows)); err != nil {
		t.Fatal(err)
	}
	pf, err := Open(plain, OpenOptions{SkipHashCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	if a, err := pf.Auth(); err != nil || !a.Empty() {
		t.Fatalf("a file without auth: %+v, %v", a, err)
	}
}

// TestEtcdutlStatusWithAuth: etcdutl reads a file with auth buckets and
// reports the hash Info computed.
func TestEtcdutlStatusWithAuth(t *testing.T) {
	etcdtest.Require(t)
	path := filepath.Join(t.TempDir(), "snap.db")
	rows := []etcdfmt.Entry{{Rev: etcdfmt.Revision{Main: 2}, KV: kv("a", 2, 2, 1, "x")}}
	info, err := Write(t.Context(), path, WriteOptions{Auth: testAuth()}, feed(rows))
	if err != nil {
		t.Fatal(err)
	}
	checkStatus(t, path, info, 2)
}

func TestAuthRejects(t *testing.T) {
	rows := []etcdfmt.Entry{{Rev: etcdfmt.Revision{Main: 2}, KV: kv("a", 2, 2, 1, "x")}}
	for _, tc := range []struct {
		what string
		auth *Auth
		want string
	}{
		{"unnamed user", &Auth{Users: []*authpb.User{{Password: []byte("h")}}}, "authUsers: a record without a name"},
		{"user twice", &Auth{Users: []*authpb.User{{Name: []byte("u")}, {Name: []byte("u")}}}, `authUsers: "u" given twice`},
		{"role twice", &Auth{Roles: []*authpb.Role{{Name: []byte("r")}, {Name: []byte("r")}}}, `authRoles: "r" given twice`},
	} {
		_, err := Write(t.Context(), filepath.Join(t.TempDir(), "snap.db"), WriteOptions{Auth: tc.auth}, feed(rows))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.what, err, tc.want)
		}
	}

	// A record that does not decode, or sits under another name, names
	// itself.
	for _, tc := range []struct {
		what, bucket, key string
		value             []byte
		want              string
	}{
		{"garbage user", "authUsers", "alice", []byte{0xff, 0xff}, `authUsers row "alice"`},
		{"user under another name", "authUsers", "alice", mustMarshal(t, &authpb.User{Name: []byte("bob")}), `holds user "bob"`},
		{"role under another name", "authRoles", "r", mustMarshal(t, &authpb.Role{Name: []byte("s")}), `holds role "s"`},
		{"short revision", "auth", "authRevision", []byte{1, 2}, "authRevision is 2 bytes"},
	} {
		path := boltFile(t, t.TempDir(), "snap.db", "key", "meta", tc.bucket)
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte(tc.bucket)).Put([]byte(tc.key), tc.value) }); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		f, err := Open(path, OpenOptions{SkipHashCheck: true})
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.Auth()
		_ = f.Close()
		if !errors.Is(err, etcdfmt.ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrMalformed naming %q", tc.what, err, tc.want)
		}
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
