// Package lease owns the in-memory side of etcd leases: which leases exist,
// when each expires, which keys are attached to each, and the loop that
// revokes expired leases.
//
// It does no I/O. Granting, revoking and attaching are made durable by the
// MVCC writer, which calls into the Lessor only after its batch committed, so
// the Lessor never claims a lease or attachment the store does not hold.
// Expiry times are not persisted: as in etcd, a restarted server gives each
// lease its full TTL again, which never expires a lease early (DESIGN.md,
// "Leases").
package lease

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/engramkv/engram/core/internal/clock"
)

// Limits as etcd's.
const (
	// MaxTTL is the largest TTL a lease may be granted (etcd MaxLeaseTTL).
	MaxTTL = 9000000000
	// DefaultMinTTL is etcd's minimum TTL with its default election timeout:
	// shorter requests are granted this TTL.
	DefaultMinTTL = 2
)

// ErrNotFound is returned for a lease that does not exist or has expired.
var ErrNotFound = errors.New("lease: not found")

// Lessor tracks live leases. All methods are safe for concurrent use.
type Lessor struct {
	mu     sync.Mutex
	leases map[int64]*entry
	minTTL int64
	clock  clock.Clock
	// wake is signalled when the earliest expiry may have moved earlier.
	wake chan struct{}
}

type entry struct {
	ttl    int64
	expiry time.Time
	keys   map[string]struct{}
	// revoking is set while a revoke of this expired lease is in flight, so
	// the loop does not submit it twice.
	revoking bool
}

// Options configure a Lessor.
type Options struct {
	// MinTTL is the smallest TTL granted; 0 means DefaultMinTTL.
	MinTTL int64
	// Clock reads the time for expiry and times Run's waits; nil means the
	// system clock. Tests inject a fake one.
	Clock clock.Clock
}

// New returns an empty Lessor.
func New(opts Options) *Lessor {
	if opts.MinTTL <= 0 {
		opts.MinTTL = DefaultMinTTL
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real
	}
	return &Lessor{
		leases: make(map[int64]*entry),
		minTTL: opts.MinTTL,
		clock:  opts.Clock,
		wake:   make(chan struct{}, 1),
	}
}

// EffectiveTTL returns the TTL a grant request for ttl receives.
func (l *Lessor) EffectiveTTL(ttl int64) int64 {
	return max(ttl, l.minTTL)
}

// NewID returns an unused positive lease ID.
func (l *Lessor) NewID() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		id := rand.Int64N(math.MaxInt64-1) + 1
		if _, ok := l.leases[id]; !ok {
			return id
		}
	}
}

// Exists reports whether id is a live lease (granted and not expired).
func (l *Lessor) Exists(id int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.leases[id]
	return ok && !e.expiredAt(l.clock.Now())
}

// Known reports whether id is granted and not yet revoked, expired or not.
func (l *Lessor) Known(id int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.leases[id]
	return ok
}

func (e *entry) expiredAt(now time.Time) bool { return !now.Before(e.expiry) }

// Grant records a committed lease with its full TTL from now.
func (l *Lessor) Grant(id, ttl int64) {
	l.mu.Lock()
	l.leases[id] = &entry{ttl: ttl, expiry: l.clock.Now().Add(time.Duration(ttl) * time.Second), keys: map[string]struct{}{}}
	l.mu.Unlock()
	l.signal()
}

// Revoke forgets a lease whose revocation committed.
func (l *Lessor) Revoke(id int64) {
	l.mu.Lock()
	delete(l.leases, id)
	l.mu.Unlock()
}

// Attach records that key is bound to lease id. Unknown IDs are ignored: the
// writer checked existence before committing.
func (l *Lessor) Attach(id int64, key []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.leases[id]; ok {
		e.keys[string(key)] = struct{}{}
	}
}

// Detach removes key from lease id.
func (l *Lessor) Detach(id int64, key []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.leases[id]; ok {
		delete(e.keys, string(key))
	}
}

// Keys returns the keys attached to lease id, sorted.
func (l *Lessor) Keys(id int64) [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.leases[id]
	if !ok {
		return nil
	}
	keys := make([]string, 0, len(e.keys))
	for k := range e.keys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = []byte(k)
	}
	return out
}

// Renew extends a live lease to its full TTL from now and returns the TTL.
func (l *Lessor) Renew(id int64) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.leases[id]
	if !ok || e.expiredAt(l.clock.Now()) {
		return 0, ErrNotFound
	}
	e.expiry = l.clock.Now().Add(time.Duration(e.ttl) * time.Second)
	return e.ttl, nil
}

// Info describes one lease.
type Info struct {
	ID int64
	// TTL is the granted TTL in seconds.
	TTL int64
	// Remaining is the time left in whole seconds, truncated like etcd's.
	Remaining int64
}

// Lookup returns the state of a live lease.
func (l *Lessor) Lookup(id int64) (Info, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.leases[id]
	now := l.clock.Now()
	if !ok || e.expiredAt(now) {
		return Info{}, ErrNotFound
	}
	return Info{ID: id, TTL: e.ttl, Remaining: remaining(e, now)}, nil
}

// remaining is the whole seconds left, truncated as etcd's LeaseTimeToLive
// truncates them: a lease granted 10 s reads 9 a moment later.
func remaining(e *entry, now time.Time) int64 {
	d := e.expiry.Sub(now)
	if d <= 0 {
		return 0
	}
	return int64(d / time.Second)
}

// List returns the IDs of all live leases, the soonest to expire first, as
// etcd's LeaseLeases orders them (clients that print the list, etcdctl lease
// list among them, show that order). Leases expiring at the same instant,
// which etcd leaves in map order, are ordered by ID so the answer is stable.
func (l *Lessor) List() []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	type live struct {
		id     int64
		expiry time.Time
	}
	ls := make([]live, 0, len(l.leases))
	for id, e := range l.leases {
		if !e.expiredAt(now) {
			ls = append(ls, live{id, e.expiry})
		}
	}
	slices.SortFunc(ls, func(a, b live) int {
		if c := a.expiry.Compare(b.expiry); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	ids := make([]int64, len(ls))
	for i, x := range ls {
		ids[i] = x.id
	}
	return ids
}

func (l *Lessor) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// expired returns expired leases not yet being revoked, marking them, and the
// time of the next expiry among the rest.
func (l *Lessor) expired() ([]int64, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	var ids []int64
	var next time.Time
	for id, e := range l.leases {
		switch {
		case e.revoking:
		case e.expiredAt(now):
			e.revoking = true
			ids = append(ids, id)
		case next.IsZero() || e.expiry.Before(next):
			next = e.expiry
		}
	}
	slices.Sort(ids)
	return ids, next
}

func (l *Lessor) revokeFailed(id int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.leases[id]; ok {
		e.revoking = false
	}
}

// Run revokes expired leases with revoke until ctx is done. revoke must make
// the revocation durable (deleting the attached keys) and call Revoke. A
// failed revoke is retried after retry.
func (l *Lessor) Run(ctx context.Context, log *slog.Logger, revoke func(context.Context, int64) error, retry time.Duration) {
	if retry <= 0 {
		retry = 500 * time.Millisecond
	}
	for {
		// This pass sees every grant signalled so far: drop their wake, so
		// that a grant before Run or during the last pass does not cost a
		// second pass.
		select {
		case <-l.wake:
		default:
		}
		ids, next := l.expired()
		failed := false
		for _, id := range ids {
			if err := revoke(ctx, id); err != nil {
				if ctx.Err() != nil {
					return
				}
				log.Warn("revoking expired lease failed; will retry", "lease", id, "err", err)
				l.revokeFailed(id)
				failed = true
			}
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(next.Sub(l.clock.Now()), time.Millisecond)
		}
		if failed {
			wait = min(wait, retry)
		}
		timer := l.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-l.wake:
		case <-timer.C():
		}
		timer.Stop()
	}
}
