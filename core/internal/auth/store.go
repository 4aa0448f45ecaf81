package auth

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"golang.org/x/crypto/bcrypt"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/internal/periodic"
)

// Records in the store's meta space: the whole state, and its revision
// alone so that polling costs one small Get.
const (
	stateRecord = "auth/state"
	revRecord   = "auth/rev"
)

// PollInterval is how often a member re-reads the revision record to pick
// up changes another member (the leader) made.
const PollInterval = 500 * time.Millisecond

// errNoChange ends a mutation that changes nothing, with success.
var errNoChange = errors.New("no change")

// errKeepRevision commits a change without moving the auth revision, as
// etcd's enable does not move it.
var errKeepRevision = errors.New("keep revision")

// Change is one mutation of the state (AddUser, GrantRole, ...).
type Change func(*state) error

// Commit writes meta records with the leader's fence (mvcc's CommitMeta).
type Commit func(ctx context.Context, ops []kv.Op) error

// Options configure a Store.
type Options struct {
	Store  kv.Store
	Tokens Tokens
	// BcryptCost hashes passwords; 0 means bcrypt's default (etcd's 10).
	BcryptCost int
	// ClientCertAuth names a caller without a token by the CN of its
	// verified client certificate (etcd's --client-cert-auth).
	ClientCertAuth bool
	Logger         *slog.Logger
}

// Store is the auth state of this member: an in-memory copy of the
// persisted record, answering checks without touching the store.
type Store struct {
	kv     kv.Store
	tokens Tokens
	log    *slog.Logger
	cost   int
	dummy  []byte // a hash compared against for a missing user

	certAuth bool
	fwdKey   []byte // signs forwarded callers (forward.go)
	cur      atomic.Pointer[state]
	mu       sync.Mutex // serialises loads and mutations
}

// Open loads the persisted state (an empty, disabled one if none).
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.BcryptCost == 0 {
		opts.BcryptCost = bcrypt.DefaultCost
	}
	if opts.BcryptCost < bcrypt.MinCost || opts.BcryptCost > bcrypt.MaxCost {
		return nil, fmt.Errorf("auth: bcrypt cost %d is outside [%d, %d]", opts.BcryptCost, bcrypt.MinCost, bcrypt.MaxCost)
	}
	if opts.Tokens == nil {
		return nil, errors.New("auth: no token provider")
	}
	dummy, err := bcrypt.GenerateFromPassword([]byte("engram: no such user"), opts.BcryptCost)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	s := &Store{kv: opts.Store, tokens: opts.Tokens, log: opts.Logger, cost: opts.BcryptCost, dummy: dummy, certAuth: opts.ClientCertAuth}
	s.cur.Store(emptyState())
	if s.fwdKey, err = loadForwardKey(ctx, opts.Store); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	if err := s.Reload(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) state() *state { return s.cur.Load() }

// Run polls the revision record until ctx ends.
func (s *Store) Run(ctx context.Context) {
	periodic.Run(ctx, PollInterval, func(ctx context.Context) {
		if err := s.refresh(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("poll auth revision", "err", err)
		}
	})
}

// refresh reloads the state when the revision record moved.
func (s *Store) refresh(ctx context.Context) error {
	raw, err := s.kv.Get(ctx, coder.MetaKey(revRecord))
	if errors.Is(err, kv.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read auth revision: %w", err)
	}
	if len(raw) == 8 && binary.BigEndian.Uint64(raw) == s.state().Gen {
		return nil
	}
	return s.Reload(ctx)
}

// Reload reads the whole state record.
func (s *Store) Reload(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.loadLocked(ctx)
	return err
}

func (s *Store) loadLocked(ctx context.Context) (*state, error) {
	raw, err := s.kv.Get(ctx, coder.MetaKey(stateRecord))
	if errors.Is(err, kv.ErrNotFound) {
		return s.state(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read auth state: %w", err)
	}
	st, err := decodeState(raw)
	if err != nil {
		return nil, err
	}
	s.publish(st)
	return st, nil
}

// publish makes st current and drops the simple tokens it invalidates:
// all of them when auth went off, a user's when the user went or its
// password changed, as etcd drops them.
func (s *Store) publish(st *state) {
	old := s.cur.Swap(st)
	if s.tokens == nil || old == nil {
		return
	}
	if !st.Enabled {
		s.tokens.invalidate(func(string) bool { return true })
		return
	}
	s.tokens.invalidate(func(user string) bool {
		u, o := st.Users[user], old.Users[user]
		return u == nil || o == nil || string(u.Hash) != string(o.Hash)
	})
}

// Mutate applies change to a fresh copy of the state read from the store,
// bumps the revision and commits both records with commit (the leader's
// fenced writer). Only the leader calls it.
func (s *Store) Mutate(ctx context.Context, commit Commit, change Change) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	base, err := s.loadLocked(ctx)
	if err != nil {
		return err
	}
	st := base.clone()
	switch err := change(st); {
	case errors.Is(err, errNoChange):
		return nil
	case errors.Is(err, errKeepRevision):
	case err != nil:
		return err
	default:
		st.Revision++
	}
	st.Gen++
	raw, err := st.encode()
	if err != nil {
		return fmt.Errorf("encode auth state: %w", err)
	}
	rev := binary.BigEndian.AppendUint64(nil, st.Gen)
	if err := commit(ctx, []kv.Op{kv.Put(coder.MetaKey(stateRecord), raw), kv.Put(coder.MetaKey(revRecord), rev)}); err != nil {
		return fmt.Errorf("commit auth state: %w", err)
	}
	st.derive()
	s.publish(st)
	return nil
}

// Enabled reports whether auth is on.
func (s *Store) Enabled() bool { return s.state().Enabled }

// Revision is the auth revision this member holds.
func (s *Store) Revision() uint64 { return s.state().Revision }

// HasRole reports whether user holds role.
func (s *Store) HasRole(user, role string) bool {
	u := s.state().Users[user]
	return u != nil && u.hasRole(role)
}

// isOpPermitted is etcd's rule: a caller, a token not older than the
// state, a known user, then root or a covering range.
func (s *Store) isOpPermitted(ai *Info, key, end []byte, write bool) error {
	st := s.state()
	if !st.Enabled {
		return nil
	}
	if ai == nil || ai.Revision == 0 {
		return rpctypes.ErrGRPCUserEmpty
	}
	if ai.Revision < st.Revision {
		return rpctypes.ErrGRPCAuthOldRevision
	}
	u := st.Users[ai.Username]
	if u == nil {
		return rpctypes.ErrGRPCPermissionDenied
	}
	if u.hasRole(RootRole) {
		return nil
	}
	p := st.perms[ai.Username]
	ivs := p.read
	if write {
		ivs = p.write
	}
	if covers(ivs, key, end) {
		return nil
	}
	return rpctypes.ErrGRPCPermissionDenied
}

// IsRangePermitted implements Checker.
func (s *Store) IsRangePermitted(ai *Info, key, end []byte) error {
	return s.isOpPermitted(ai, key, end, false)
}

// IsPutPermitted implements Checker.
func (s *Store) IsPutPermitted(ai *Info, key []byte) error {
	return s.isOpPermitted(ai, key, nil, true)
}

// IsDeleteRangePermitted implements Checker.
func (s *Store) IsDeleteRangePermitted(ai *Info, key, end []byte) error {
	return s.isOpPermitted(ai, key, end, true)
}

// IsAdminPermitted implements Checker.
func (s *Store) IsAdminPermitted(ai *Info) error {
	st := s.state()
	if !st.Enabled {
		return nil
	}
	if ai == nil || ai.Username == "" {
		return rpctypes.ErrGRPCUserEmpty
	}
	u := st.Users[ai.Username]
	if u == nil {
		return rpctypes.ErrGRPCUserNotFound
	}
	if !u.hasRole(RootRole) {
		return rpctypes.ErrGRPCPermissionDenied
	}
	return nil
}
