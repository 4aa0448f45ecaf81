package auth

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"go.etcd.io/etcd/api/v3/authpb"
)

// stateVersion is the encoding of the persisted state; a reader refuses
// one it does not know rather than guess.
const stateVersion = 1

// User is one user: a bcrypt hash, or none for a certificate-only user.
type User struct {
	Name       string   `json:"name"`
	Hash       []byte   `json:"hash,omitempty"`
	NoPassword bool     `json:"noPassword,omitempty"`
	Roles      []string `json:"roles,omitempty"` // sorted
}

// Perm is one key-range permission of a role.
type Perm struct {
	Type     authpb.Permission_Type `json:"type"`
	Key      []byte                 `json:"key"`
	RangeEnd []byte                 `json:"rangeEnd,omitempty"`
}

// Role is a named set of permissions, sorted by key as etcd keeps them.
type Role struct {
	Name  string `json:"name"`
	Perms []Perm `json:"perms,omitempty"`
}

// state is the whole auth state; it is never changed in place once
// published (mutations work on a clone).
type state struct {
	Version  int    `json:"v"`
	Revision uint64 `json:"rev"`
	// Gen counts every committed change, including those that do not move
	// the auth revision (etcd's enable), so pollers see them all.
	Gen     uint64           `json:"gen"`
	Enabled bool             `json:"enabled"`
	Users   map[string]*User `json:"users"`
	Roles   map[string]*Role `json:"roles"`

	perms map[string]*userPerms // derived: merged ranges per user
}

func emptyState() *state {
	return &state{Version: stateVersion, Revision: 1, Users: map[string]*User{}, Roles: map[string]*Role{}}
}

func decodeState(raw []byte) (*state, error) {
	st := emptyState()
	if err := json.Unmarshal(raw, st); err != nil {
		return nil, fmt.Errorf("decode auth state: %w", err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("auth state has encoding version %d, this build reads %d", st.Version, stateVersion)
	}
	st.derive()
	return st, nil
}

func (st *state) encode() ([]byte, error) { return json.Marshal(st) }

// clone copies the state deeply enough for a mutation to change it.
func (st *state) clone() *state {
	c := &state{Version: stateVersion, Revision: st.Revision, Gen: st.Gen, Enabled: st.Enabled,
		Users: make(map[string]*User, len(st.Users)), Roles: make(map[string]*Role, len(st.Roles))}
	for k, u := range st.Users {
		cu := *u
		cu.Roles = slices.Clone(u.Roles)
		c.Users[k] = &cu
	}
	for k, r := range st.Roles {
		cr := *r
		cr.Perms = slices.Clone(r.Perms)
		c.Roles[k] = &cr
	}
	return c
}

func (u *User) hasRole(r string) bool { _, ok := slices.BinarySearch(u.Roles, r); return ok }

// derive computes each user's merged read and write ranges, as etcd's
// range permission cache does, so checks need no walk over roles.
func (st *state) derive() {
	st.perms = make(map[string]*userPerms, len(st.Users))
	for name, u := range st.Users {
		p := &userPerms{}
		for _, rn := range u.Roles {
			r := st.Roles[rn]
			if r == nil {
				continue
			}
			for _, pm := range r.Perms {
				iv := interval{begin: pm.Key, end: pm.RangeEnd}
				if len(pm.RangeEnd) == 0 {
					iv.end = append(slices.Clone(pm.Key), 0) // one key
				}
				if isOpenEnded(pm.RangeEnd) {
					iv.end = nil
				}
				if pm.Type == authpb.READ || pm.Type == authpb.READWRITE {
					p.read = append(p.read, iv)
				}
				if pm.Type == authpb.WRITE || pm.Type == authpb.READWRITE {
					p.write = append(p.write, iv)
				}
			}
		}
		p.read, p.write = merge(p.read), merge(p.write)
		st.perms[name] = p
	}
}

func isOpenEnded(end []byte) bool { return len(end) == 1 && end[0] == 0 }

// validRange is etcd's rule for a permission's range: a key, and an end
// that is empty (one key), "\x00" (from key on) or after the key.
func validRange(key, end []byte) bool {
	if len(key) == 0 {
		return false
	}
	return len(end) == 0 || isOpenEnded(end) || bytes.Compare(key, end) < 0
}
