package auth

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/etcd/api/v3/authpb"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/snapshot"
)

// The auth state travels in etcd's snapshot files as etcd's own records
// (snapshot.Auth): a backup taken from Engram restores into etcd with its
// users, roles and passwords, and one taken from etcd (a restore, or the
// base of a migration) brings them into Engram. Both sides keep bcrypt
// hashes, so nothing is re-hashed and no password is needed.

// Export reads the persisted auth state from store as a snapshot holds it;
// nil when auth was never used.
func Export(ctx context.Context, store kv.Store) (*snapshot.Auth, error) {
	raw, err := store.Get(ctx, coder.MetaKey(stateRecord))
	if errors.Is(err, kv.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("auth: read the state to export: %w", err)
	}
	st, err := decodeState(raw)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	a := &snapshot.Auth{Enabled: st.Enabled, Revision: st.Revision}
	for _, name := range sortedKeys(st.Users) {
		u := st.Users[name]
		pu := &authpb.User{Name: []byte(u.Name), Password: u.Hash, Roles: slices.Clone(u.Roles)}
		if u.NoPassword {
			pu.Options = &authpb.UserAddOptions{NoPassword: true}
		}
		a.Users = append(a.Users, pu)
	}
	for _, name := range sortedKeys(st.Roles) {
		r := st.Roles[name]
		pr := &authpb.Role{Name: []byte(r.Name)}
		for _, p := range r.Perms {
			pr.KeyPermission = append(pr.KeyPermission, &authpb.Permission{PermType: p.Type, Key: p.Key, RangeEnd: p.RangeEnd})
		}
		a.Roles = append(a.Roles, pr)
	}
	return a, nil
}

// Import makes a (nil: no users, auth off) the persisted auth state of
// store, replacing any, for a store that no member serves yet (a restore, a
// migration's base): it writes without a leader's fence. A record etcd
// would not have written (a user or role without a name, an unknown
// permission type, an empty or reversed key range) is refused, naming it,
// and nothing is written.
func Import(ctx context.Context, store kv.Store, a *snapshot.Auth) error {
	recs, err := ImportRecords(ctx, store, a)
	if err != nil {
		return err
	}
	ops := make([]kv.Op, len(recs))
	for i, p := range recs {
		ops[i] = kv.Put(p.Key, p.Value)
	}
	if err := store.Commit(ctx, ops); err != nil {
		return fmt.Errorf("auth: import: commit: %w", err)
	}
	return nil
}

// ImportRecords returns the meta records Import writes, for an import that
// loads them with the data (mvcc's bulk import).
func ImportRecords(ctx context.Context, store kv.Store, a *snapshot.Auth) ([]kv.Pair, error) {
	st, err := fromSnapshot(a)
	if err != nil {
		return nil, fmt.Errorf("auth: import: %w", err)
	}
	// Members poll the generation; one past the replaced state's makes any
	// that is running reload.
	raw, err := store.Get(ctx, coder.MetaKey(revRecord))
	switch {
	case err == nil && len(raw) == 8:
		st.Gen = binary.BigEndian.Uint64(raw) + 1
	case err == nil, errors.Is(err, kv.ErrNotFound):
		st.Gen = 1
	default:
		return nil, fmt.Errorf("auth: import: read the generation: %w", err)
	}
	enc, err := st.encode()
	if err != nil {
		return nil, fmt.Errorf("auth: import: encode: %w", err)
	}
	gen := binary.BigEndian.AppendUint64(nil, st.Gen)
	return []kv.Pair{{Key: coder.MetaKey(stateRecord), Value: enc}, {Key: coder.MetaKey(revRecord), Value: gen}}, nil
}

// newName is the name of a user or role (what) read from a snapshot,
// which must have one and not repeat one already read into seen.
func newName[V any](what string, raw []byte, seen map[string]*V) (string, error) {
	name := string(raw)
	if name == "" {
		return "", fmt.Errorf("a %s without a name", what)
	}
	if seen[name] != nil {
		return "", fmt.Errorf("%s %q given twice", what, name)
	}
	return name, nil
}

func fromSnapshot(a *snapshot.Auth) (*state, error) {
	st := emptyState()
	if a == nil {
		return st, nil
	}
	st.Enabled = a.Enabled
	// etcd's first revision is 1; a file of a store that never counted one
	// says 0.
	st.Revision = max(a.Revision, 1)
	for _, pu := range a.Users {
		name, err := newName("user", pu.Name, st.Users)
		if err != nil {
			return nil, err
		}
		u := &User{Name: name, Hash: pu.Password, NoPassword: pu.Options.GetNoPassword(), Roles: slices.Clone(pu.Roles)}
		slices.Sort(u.Roles)
		u.Roles = slices.Compact(u.Roles)
		st.Users[name] = u
	}
	for _, pr := range a.Roles {
		name, err := newName("role", pr.Name, st.Roles)
		if err != nil {
			return nil, err
		}
		r := &Role{Name: name}
		for _, p := range pr.KeyPermission {
			if _, known := authpb.Permission_Type_name[int32(p.PermType)]; !known {
				return nil, fmt.Errorf("role %q: permission type %d is not READ, WRITE or READWRITE", name, p.PermType)
			}
			if !validRange(p.Key, p.RangeEnd) {
				return nil, fmt.Errorf("role %q: permission range [%q, %q) is empty or reversed", name, p.Key, p.RangeEnd)
			}
			r.Perms = append(r.Perms, Perm{Type: p.PermType, Key: p.Key, RangeEnd: p.RangeEnd})
		}
		st.Roles[name] = r
	}
	if st.Enabled {
		// etcd refuses to enable auth without a root user holding the root
		// role; a file saying otherwise would lock every caller out.
		if root := st.Users[RootUser]; root == nil || !root.hasRole(RootRole) {
			return nil, errors.New("auth is enabled but no root user holds the root role")
		}
	}
	st.derive()
	return st, nil
}
