package auth

import (
	"context"
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/authpb"
	"golang.org/x/crypto/bcrypt"

	"github.com/engramkv/engram/core/snapshot"
	"github.com/engramkv/engram/engines/memkv"
)

// TestImportExport: a state imported from a snapshot is the one a member
// then serves (a password checks against the imported hash, a role's range
// grants what it granted) and exports unchanged; importing again makes a
// running member reload (the generation moves).
func TestImportExport(t *testing.T) {
	ctx := context.Background()
	kv := memkv.New()
	hash, err := bcrypt.GenerateFromPassword([]byte("ap"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	in := &snapshot.Auth{
		Enabled:  true,
		Revision: 9,
		Users: []*authpb.User{
			{Name: []byte("root"), Password: hash, Roles: []string{"root"}},
			{Name: []byte("alice"), Password: hash, Roles: []string{"writer", "reader"}},
			{Name: []byte("carol"), Roles: []string{"reader"}, Options: &authpb.UserAddOptions{NoPassword: true}},
		},
		Roles: []*authpb.Role{
			{Name: []byte("reader"), KeyPermission: []*authpb.Permission{{PermType: authpb.READ, Key: []byte("/app/"), RangeEnd: []byte("/app0")}}},
			{Name: []byte("writer"), KeyPermission: []*authpb.Permission{{PermType: authpb.READWRITE, Key: []byte("/app/w")}}},
		},
	}
	if err := Import(ctx, kv, in); err != nil {
		t.Fatal(err)
	}
	tokens, err := NewTokens("simple", 0)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, Options{Store: kv, Tokens: tokens, BcryptCost: bcrypt.MinCost})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Enabled() || s.Revision() != 9 {
		t.Fatalf("opened enabled=%v at revision %d, want enabled at 9", s.Enabled(), s.Revision())
	}
	if _, err := s.Authenticate(ctx, "alice", "ap"); err != nil {
		t.Fatalf("alice with her password: %v", err)
	}
	if _, err := s.Authenticate(ctx, "carol", "x"); err != ErrNoPasswordUser {
		t.Fatalf("carol with a password: %v, want the no-password error", err)
	}
	alice := &Info{Username: "alice", Revision: 9}
	if err := s.IsRangePermitted(alice, []byte("/app/x"), nil); err != nil {
		t.Errorf("alice reading /app/x: %v", err)
	}
	if err := s.IsPutPermitted(alice, []byte("/app/x")); err == nil {
		t.Error("alice may write /app/x, which only her reader role covers")
	}
	if err := s.IsPutPermitted(alice, []byte("/app/w")); err != nil {
		t.Errorf("alice writing /app/w: %v", err)
	}

	out, err := Export(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	if out.Enabled != in.Enabled || out.Revision != in.Revision || len(out.Users) != 3 || len(out.Roles) != 2 {
		t.Fatalf("exported %+v", out)
	}
	if got := out.Users[0]; string(got.Name) != "alice" || strings.Join(got.Roles, ",") != "reader,writer" || string(got.Password) != string(hash) {
		t.Errorf("exported alice as %v", got)
	}
	if got := out.Users[1]; string(got.Name) != "carol" || !got.Options.GetNoPassword() || len(got.Password) != 0 {
		t.Errorf("exported carol as %v", got)
	}

	// Importing over it makes the member, polling, pick the new state up.
	gen := s.state().Gen
	in.Enabled = false
	if err := Import(ctx, kv, in); err != nil {
		t.Fatal(err)
	}
	if err := s.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Enabled() || s.state().Gen != gen+1 {
		t.Fatalf("after a second import: enabled=%v gen %d, want disabled at gen %d", s.Enabled(), s.state().Gen, gen+1)
	}
}

// TestImportRejects: what etcd would never have written is refused,
// naming it, and leaves the store without an auth state.
func TestImportRejects(t *testing.T) {
	root := &authpb.User{Name: []byte("root"), Roles: []string{"root"}}
	for _, tc := range []struct {
		what string
		auth *snapshot.Auth
		want string
	}{
		{"unnamed user", &snapshot.Auth{Users: []*authpb.User{{}}}, "a user without a name"},
		{"unnamed role", &snapshot.Auth{Roles: []*authpb.Role{{}}}, "a role without a name"},
		{"user twice", &snapshot.Auth{Users: []*authpb.User{root, root}}, `user "root" given twice`},
		{"unknown permission type", &snapshot.Auth{Roles: []*authpb.Role{{Name: []byte("r"), KeyPermission: []*authpb.Permission{{PermType: 7, Key: []byte("a")}}}}}, `role "r": permission type 7`},
		{"reversed range", &snapshot.Auth{Roles: []*authpb.Role{{Name: []byte("r"), KeyPermission: []*authpb.Permission{{Key: []byte("b"), RangeEnd: []byte("a")}}}}}, `role "r": permission range ["b", "a")`},
		{"enabled without root", &snapshot.Auth{Enabled: true, Users: []*authpb.User{{Name: []byte("root")}}}, "no root user holds the root role"},
	} {
		kv := memkv.New()
		err := Import(context.Background(), kv, tc.auth)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.what, err, tc.want)
			continue
		}
		if a, err := Export(context.Background(), kv); err != nil || a != nil {
			t.Errorf("%s: a refused import left %+v, %v", tc.what, a, err)
		}
	}
}
