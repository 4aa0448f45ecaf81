package auth

import (
	"bytes"
	"context"
	"slices"

	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The root user and role etcd treats specially.
const (
	RootUser = "root"
	RootRole = "root"
)

// The changes below are etcd 3.6's (server/auth/store.go), with its errors;
// each runs inside Mutate on a copy of the state.

// ErrNoPasswordUser is etcd's answer for a password given to a
// certificate-only user at Authenticate: it has no gRPC
// mapping there, so it reaches the client as Unknown with the auth error's
// text. The API layer passes it through as it is.
var ErrNoPasswordUser = status.Error(codes.Unknown, "auth: authentication failed, password was given for no password user")

// Enable turns auth on; it needs a root user holding the root role. An
// enable while enabled changes nothing; neither moves the revision.
func Enable(st *state) error {
	if st.Enabled {
		return errNoChange
	}
	u := st.Users[RootUser]
	if u == nil {
		return rpctypes.ErrGRPCRootUserNotExist
	}
	if !u.hasRole(RootRole) {
		return rpctypes.ErrGRPCRootRoleNotExist
	}
	st.Enabled = true
	return errKeepRevision
}

// Disable turns auth off.
func Disable(st *state) error { st.Enabled = false; return nil }

// AddUser adds a user with a bcrypt hash (nil with noPassword).
func AddUser(name string, hash []byte, noPassword bool) Change {
	return func(st *state) error {
		if name == "" {
			return rpctypes.ErrGRPCUserEmpty
		}
		if st.Users[name] != nil {
			return rpctypes.ErrGRPCUserAlreadyExist
		}
		st.Users[name] = &User{Name: name, Hash: hash, NoPassword: noPassword}
		return nil
	}
}

// DeleteUser removes a user; root cannot go while auth is on.
func DeleteUser(name string) Change {
	return func(st *state) error {
		return deleteNamed(st, st.Users, name, RootUser, rpctypes.ErrGRPCUserNotFound)
	}
}

// deleteNamed removes the user or role name from m, unless it is the root
// one (root) and auth is on; notFound is the error for one m lacks.
func deleteNamed[V any](st *state, m map[string]*V, name, root string, notFound error) error {
	if st.Enabled && name == root {
		return rpctypes.ErrGRPCInvalidAuthMgmt
	}
	if m[name] == nil {
		return notFound
	}
	delete(m, name)
	return nil
}

// ChangePassword sets a user's hash. A certificate-only user keeps having
// none: etcd 3.6 answers success and moves the revision all the same.
func ChangePassword(name string, hash []byte) Change {
	return func(st *state) error {
		u := st.Users[name]
		if u == nil {
			return rpctypes.ErrGRPCUserNotFound
		}
		if !u.NoPassword {
			u.Hash = hash
		}
		return nil
	}
}

// GrantRole gives a user a role (root needs no role record); granting a
// held role changes nothing but still counts as a change, as in etcd it
// answers success (etcd does not bump the revision then; neither do we).
func GrantRole(user, role string) Change {
	return func(st *state) error {
		u := st.Users[user]
		if u == nil {
			return rpctypes.ErrGRPCUserNotFound
		}
		if role != RootRole && st.Roles[role] == nil {
			return rpctypes.ErrGRPCRoleNotFound
		}
		if u.hasRole(role) {
			return errNoChange
		}
		u.Roles = append(u.Roles, role)
		slices.Sort(u.Roles)
		return nil
	}
}

// RevokeRole takes a role from a user; root's root role stays while auth
// is on.
func RevokeRole(user, role string) Change {
	return func(st *state) error {
		if st.Enabled && user == RootUser && role == RootRole {
			return rpctypes.ErrGRPCInvalidAuthMgmt
		}
		u := st.Users[user]
		if u == nil {
			return rpctypes.ErrGRPCUserNotFound
		}
		i := slices.Index(u.Roles, role)
		if i < 0 {
			return rpctypes.ErrGRPCRoleNotGranted
		}
		u.Roles = slices.Delete(u.Roles, i, i+1)
		return nil
	}
}

// AddRole adds an empty role.
func AddRole(name string) Change {
	return func(st *state) error {
		if name == "" {
			return rpctypes.ErrGRPCRoleEmpty
		}
		if st.Roles[name] != nil {
			return rpctypes.ErrGRPCRoleAlreadyExist
		}
		st.Roles[name] = &Role{Name: name}
		return nil
	}
}

// DeleteRole removes a role and takes it from every user.
func DeleteRole(name string) Change {
	return func(st *state) error {
		if err := deleteNamed(st, st.Roles, name, RootRole, rpctypes.ErrGRPCRoleNotFound); err != nil {
			return err
		}
		for _, u := range st.Users {
			if i := slices.Index(u.Roles, name); i >= 0 {
				u.Roles = slices.Delete(u.Roles, i, i+1)
			}
		}
		return nil
	}
}

// GrantPermission adds a permission to a role, or changes the type of one
// over the same range.
func GrantPermission(role string, p *authpb.Permission) Change {
	return func(st *state) error {
		if p == nil {
			return rpctypes.ErrGRPCPermissionNotGiven
		}
		if !validRange(p.Key, p.RangeEnd) {
			return rpctypes.ErrGRPCInvalidAuthMgmt
		}
		r := st.Roles[role]
		if r == nil {
			return rpctypes.ErrGRPCRoleNotFound
		}
		i := slices.IndexFunc(r.Perms, func(x Perm) bool {
			return bytes.Equal(x.Key, p.Key) && bytes.Equal(x.RangeEnd, p.RangeEnd)
		})
		if i >= 0 {
			r.Perms[i].Type = p.PermType
			return nil
		}
		r.Perms = append(r.Perms, Perm{Type: p.PermType, Key: p.Key, RangeEnd: p.RangeEnd})
		slices.SortStableFunc(r.Perms, func(a, b Perm) int { return bytes.Compare(a.Key, b.Key) })
		return nil
	}
}

// RevokePermission removes a role's permission over exactly [key, end).
func RevokePermission(role string, key, end []byte) Change {
	return func(st *state) error {
		r := st.Roles[role]
		if r == nil {
			return rpctypes.ErrGRPCRoleNotFound
		}
		n := len(r.Perms)
		r.Perms = slices.DeleteFunc(r.Perms, func(x Perm) bool {
			return bytes.Equal(x.Key, key) && bytes.Equal(x.RangeEnd, end)
		})
		if len(r.Perms) == n {
			return rpctypes.ErrGRPCPermissionNotGranted
		}
		return nil
	}
}

// Authenticate checks a password and returns a token, as etcd's
// Authenticate: auth must be on; a missing user and a wrong password answer
// "authentication failed", a certificate-only user etcd's no-password
// error (Unknown).
func (s *Store) Authenticate(ctx context.Context, name, password string) (string, error) {
	st := s.state()
	if !st.Enabled {
		return "", rpctypes.ErrGRPCAuthNotEnabled
	}
	u := st.Users[name]
	if u != nil && u.NoPassword {
		return "", ErrNoPasswordUser
	}
	// A missing user is compared against a hash of the same cost, so
	// the time taken does not tell it from a wrong password (etcd
	// answers at once for a missing user).
	hash := s.dummy
	if u != nil {
		hash = u.Hash
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil || u == nil {
		return "", rpctypes.ErrGRPCAuthFailed
	}
	return s.tokens.assign(ctx, name, st.Revision)
}

// User returns a user, or nil.
func (s *Store) User(name string) *User { return s.state().Users[name] }

// Role returns a role, or nil.
func (s *Store) Role(name string) *Role { return s.state().Roles[name] }

// Users lists the user names, sorted.
func (s *Store) Users() []string { return sortedKeys(s.state().Users) }

// Roles lists the role names, sorted.
func (s *Store) Roles() []string { return sortedKeys(s.state().Roles) }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Hash hashes a password at the configured cost.
func (s *Store) Hash(password string) ([]byte, error) {
	return bcrypt.GenerateFromPassword([]byte(password), s.cost)
}
