package snapshot

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/authpb"
	"google.golang.org/protobuf/proto"

	"github.com/engramkv/engram/core/etcdfmt"
)

// Auth is etcd's auth state as a snapshot file holds it: the "auth"
// bucket's enabled flag and revision, and every user ("authUsers") and role
// ("authRoles") as etcd's own protobuf records. Passwords are bcrypt
// hashes, which Engram keeps the same way, so users move between etcd and
// Engram with the passwords they had.
type Auth struct {
	Enabled  bool
	Revision uint64
	Users    []*authpb.User
	Roles    []*authpb.Role
}

// Empty reports whether a holds nothing to restore: auth was never used
// (etcd's auth buckets exist in every file it writes, most of them empty).
func (a *Auth) Empty() bool {
	return a == nil || !a.Enabled && len(a.Users) == 0 && len(a.Roles) == 0
}

// authRows returns each auth bucket's rows in bbolt's order (buckets by
// name, keys by bytes), refusing unnamed or repeated users and roles.
func authRows(a *Auth) (map[string][][2][]byte, error) {
	enabled := []byte{0}
	if a.Enabled {
		enabled = []byte{1}
	}
	rows := map[string][][2][]byte{
		string(etcdfmt.BucketAuth): {
			{etcdfmt.AuthEnabled, enabled},
			{etcdfmt.AuthRevision, binary.BigEndian.AppendUint64(nil, a.Revision)},
		},
	}
	for _, u := range a.Users {
		v, err := proto.Marshal(u)
		if err != nil {
			return nil, fmt.Errorf("user %q: %w", u.Name, err)
		}
		rows[string(etcdfmt.BucketAuthUsers)] = append(rows[string(etcdfmt.BucketAuthUsers)], [2][]byte{u.Name, v})
	}
	for _, r := range a.Roles {
		v, err := proto.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("role %q: %w", r.Name, err)
		}
		rows[string(etcdfmt.BucketAuthRoles)] = append(rows[string(etcdfmt.BucketAuthRoles)], [2][]byte{r.Name, v})
	}
	for name, rs := range rows {
		slices.SortFunc(rs, func(a, b [2][]byte) int { return bytes.Compare(a[0], b[0]) })
		for i, r := range rs {
			if len(r[0]) == 0 {
				return nil, fmt.Errorf("%s: a record without a name", name)
			}
			if i > 0 && bytes.Equal(r[0], rs[i-1][0]) {
				return nil, fmt.Errorf("%s: %q given twice", name, r[0])
			}
		}
	}
	return rows, nil
}

// putAuth writes a's buckets. They sort before "key", so they are written
// (and hashed) before the key rows.
func (w *writer) putAuth(a *Auth) error {
	rows, err := authRows(a)
	if err != nil {
		return err
	}
	for _, name := range [][]byte{etcdfmt.BucketAuth, etcdfmt.BucketAuthRoles, etcdfmt.BucketAuthUsers} {
		b, err := w.tx.CreateBucket(name)
		if err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
		w.ib.bucket(name)
		for _, r := range rows[string(name)] {
			if err := b.Put(r[0], r[1]); err != nil {
				return fmt.Errorf("put %s %q: %w", name, r[0], err)
			}
			w.ib.row(r[0], r[1])
		}
	}
	return nil
}

// Auth returns the file's auth state; Empty reports a file without users,
// roles or auth ever enabled. A record that does not decode, or is filed
// under a name other than its own, is an error naming it.
func (f *File) Auth() (*Auth, error) {
	a := &Auth{}
	err := guard(func() error {
		return f.db.View(func(tx *bolt.Tx) error {
			if b := tx.Bucket(etcdfmt.BucketAuth); b != nil {
				a.Enabled = bytes.Equal(b.Get(etcdfmt.AuthEnabled), []byte{1})
				if v := b.Get(etcdfmt.AuthRevision); v != nil {
					if len(v) != 8 {
						return fmt.Errorf("auth bucket: %w: authRevision is %d bytes, want 8", etcdfmt.ErrMalformed, len(v))
					}
					a.Revision = binary.BigEndian.Uint64(v)
				}
			}
			var err error
			if a.Users, err = namedRows(tx, etcdfmt.BucketAuthUsers, "user", func() *authpb.User { return &authpb.User{} }); err != nil {
				return err
			}
			a.Roles, err = namedRows(tx, etcdfmt.BucketAuthRoles, "role", func() *authpb.Role { return &authpb.Role{} })
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("snapshot: %s: %w", f.path, f.hashFirst(err))
	}
	return a, nil
}

// namedRows decodes the rows of an auth bucket of users or roles (what),
// if the snapshot has it: each row is one, under its own name.
func namedRows[T interface {
	proto.Message
	GetName() []byte
}](tx *bolt.Tx, bucket []byte, what string, newRow func() T) ([]T, error) {
	b := tx.Bucket(bucket)
	if b == nil {
		return nil, nil
	}
	var rows []T
	err := b.ForEach(func(k, v []byte) error {
		row := newRow()
		if err := proto.Unmarshal(v, row); err != nil {
			return fmt.Errorf("%s row %q: %w: %w", bucket, k, etcdfmt.ErrMalformed, err)
		}
		if !bytes.Equal(row.GetName(), k) {
			return fmt.Errorf("%s row %q: %w: holds %s %q", bucket, k, etcdfmt.ErrMalformed, what, row.GetName())
		}
		rows = append(rows, row)
		return nil
	})
	return rows, err
}
