// Package tikv is Engram's kv.Store on a TiKV cluster, built on the
// transactional API of github.com/tikv/client-go/v2 (txnkv).
//
// It owns the mapping of the kv contract onto TiKV: a key namespace (Prefix)
// so that several Engram clusters can share one TiKV, a one-byte value
// framing (TiKV cannot store empty values), snapshot reads at PD timestamps,
// one optimistic transaction per Commit with its conditions checked inside
// it, the classification of client-go's errors into "not applied" and
// kv.ErrUncertain, partitions from the region cache, the namespace's size
// from PD's region statistics (size.go, pdstats.go), and MVCC garbage
// collection of the TiKV cluster (optional). It must not interpret keys or
// values (revisions, leases and MVCC belong to the core), must not expose
// client-go's error vocabulary to callers (they see the errors of package kv,
// wrapped with context), and must not coordinate Engram nodes: leader
// election and fencing live in the core, on top of Commit's conditions.
//
// # Reads
//
// Get reads from a snapshot at a timestamp fetched from PD when Get is
// called. Every Commit that returned nil committed at an earlier timestamp,
// so Get observes it (linearizable with respect to Commit). Scan fetches its
// timestamp when Scan is called, so the iterator's snapshot is fixed there;
// TiKV keeps no resources for a snapshot, so an iterator costs nothing
// server-side until Next asks for the next batch. A snapshot older than the
// cluster's GC safe point can no longer be read; see Options.GCLifeTime.
//
// # Writes
//
// Commit runs one optimistic transaction: it reads the keys of the batch's
// conditional operations at the transaction's start timestamp, checks the
// conditions in op order, buffers every write and commits with plain
// two-phase commit (async commit and 1PC are switched off, because the
// error classification below relies on the primary key's commit being the
// single commit point). A condition key is always written when its
// condition holds, so a concurrent writer of that key makes TiKV report a
// write conflict at prewrite; Commit then re-runs the batch on a fresh
// snapshot, where the condition is re-checked against the new value, a
// bounded number of times. See commit.go for how every client-go error is
// mapped.
//
// # Size
//
// Size (kv.Sizer: Status's DbSize, the db size metrics, the quota) is the
// sum of the approximate sizes PD holds for the regions overlapping the
// namespace, asked of PD's HTTP API on the PD endpoints: whole regions, in
// MiB, as of TiKV's last region heartbeats, every MVCC version not yet
// collected included. See Size for what that means for a small namespace
// and for the quota.
//
// # Logging
//
// client-go and its PD client log through a process-wide zap logger. Open
// replaces it with one that forwards to Options.Logger (client-go's info
// chatter at debug level), so the most recently opened Store receives the
// engine's logs. That is the one piece of process-wide state this package
// touches, forced on it by client-go.
package tikv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	tikverr "github.com/tikv/client-go/v2/error"
	"github.com/tikv/client-go/v2/oracle"
	tikvclient "github.com/tikv/client-go/v2/tikv"
	"github.com/tikv/client-go/v2/txnkv/transaction"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/gate"
	"github.com/engramkv/engram/internal/periodic"
)

const (
	// valueTag starts every stored value. TiKV's transactions refuse
	// empty values (client-go treats them as deletions), which the
	// contract requires us to store; the tag also lets reads recognise
	// data that another program wrote under our prefix.
	valueTag byte = 0x01

	defaultDialTimeout    = 10 * time.Second
	defaultRequestTimeout = 30 * time.Second
	defaultGCLifeTime     = 10 * time.Minute
	// minGCLifeTime keeps a misconfiguration from collecting the versions
	// that in-flight reads and scans are still reading.
	minGCLifeTime = time.Minute

	// maxPartitions bounds the region lookups of one Partitions call:
	// past it the rest of the range becomes one last partition.
	maxPartitions = 4096
	// locateMaxBackoff is the backoff budget (ms) of one region lookup,
	// as client-go uses for point reads.
	locateMaxBackoff = 20000
)

// Options configures Open (and New, which uses only the fields that do not
// concern the connection).
type Options struct {
	// PDEndpoints are the addresses (host:port) of the cluster's PD
	// servers. Required by Open.
	PDEndpoints []string
	// TLS secures the connections to PD and TiKV. The zero value connects
	// in plaintext.
	TLS TLSOptions
	// Prefix is prepended to every key the store writes and stripped from
	// every key it returns, so several Engram clusters can share one TiKV
	// cluster. Prefixes of clusters sharing a TiKV must not be prefixes of
	// one another ("engram/a/" and "engram/b/", not "engram/" and
	// "engram/b/"). Required, and not all 0xFF bytes: the namespace must
	// have a finite end, because a reverse scan has to start from a key
	// (client-go cannot locate the region at "the end of the keyspace").
	Prefix []byte
	// Logger receives the adaptor's logs and client-go's (warnings and
	// errors; its info logs at debug level). Nil discards them.
	Logger *slog.Logger
	// DialTimeout bounds connecting to PD in Open; 0 means 10s.
	DialTimeout time.Duration
	// RequestTimeout bounds each Get, Commit and Partitions call, and the
	// timestamp fetch of Scan, when the caller's context has no earlier
	// deadline. client-go's own retry budgets are long (20-40s of backoff
	// per phase); this keeps a call against an unreachable cluster from
	// hanging longer. 0 means 30s; negative leaves only the caller's
	// context.
	RequestTimeout time.Duration
	// GCInterval is the pause between MVCC garbage collection runs of the
	// TiKV cluster. 0 disables GC. Without GC nobody removes old versions
	// from a TiKV cluster that has no TiDB in front of it, so a dedicated
	// cluster needs it; see GC in gc.go for how it cooperates with other
	// users of the cluster.
	GCInterval time.Duration
	// GCLifeTime is how much history GC keeps: versions older than
	// now-GCLifeTime (and not the latest) are removed, and snapshots older
	// than that fail. It must exceed the longest scan; 0 means 10 minutes,
	// and values under a minute are raised to a minute.
	GCLifeTime time.Duration
	// RegionStats is where Size learns the namespace's size. Nil in Open
	// means PD's HTTP API on PDEndpoints, with TLS (pdstats.go); nil in
	// New leaves Size failing (package tikvmock sets its own).
	RegionStats RegionStatsSource
	// Clock is the time Size's one-second reuse of a measure is judged
	// by; nil is time.Now. Tests set it to move time instead of waiting.
	Clock func() time.Time
}

// TLSOptions are PEM files for TLS towards PD and TiKV.
type TLSOptions struct {
	// CAFile is the CA bundle that signed the servers' certificates.
	// Setting it turns TLS on.
	CAFile string
	// CertFile and KeyFile are the client certificate and its key, for
	// clusters that require client authentication. Set both or neither;
	// they need CAFile.
	CertFile string
	KeyFile  string
}

func (o TLSOptions) validate() error {
	if (o.CertFile == "") != (o.KeyFile == "") {
		return errors.New("TLS cert file and key file must be set together")
	}
	if o.CertFile != "" && o.CAFile == "" {
		return errors.New("a TLS client certificate needs the CA file too")
	}
	return nil
}

// Store is the TiKV adaptor. It is safe for concurrent use.
type Store struct {
	kvs            *tikvclient.KVStore
	log            *slog.Logger
	prefix         []byte
	prefixEnd      []byte // first key after the namespace
	requestTimeout time.Duration

	// gate is held shared by every call that touches the client and
	// exclusively by Close, so Close waits for in-flight calls and nothing
	// touches the client after it is closed.
	gate gate.Gate

	// gc runs TiKV's GC (runGC); nil when off.
	gc *periodic.Task
	// onClose runs after the client is closed (Open's PD client context).
	onClose func()

	stats struct {
		commits, retries, conflicts, uncertain atomic.Uint64
	}

	regionStats RegionStatsSource
	now         func() time.Time
	size        sizeCache
}

// Stats counts Commit outcomes since the store was opened.
type Stats struct {
	// Commits is the number of batches applied.
	Commits uint64
	// Retries is the number of times a batch was re-run after TiKV
	// reported a write conflict.
	Retries uint64
	// Conflicts is the number of batches refused with a *kv.ConflictError.
	Conflicts uint64
	// Uncertain is the number of Commits that returned kv.ErrUncertain.
	Uncertain uint64
}

// Stats returns the commit counters.
func (s *Store) Stats() Stats {
	return Stats{
		Commits:   s.stats.commits.Load(),
		Retries:   s.stats.retries.Load(),
		Conflicts: s.stats.conflicts.Load(),
		Uncertain: s.stats.uncertain.Load(),
	}
}

var _ kv.Store = (*Store)(nil)

// New wraps a client-go store that the caller built (the in-process mock
// of package tikvmock, or a client with custom settings). The Store takes
// ownership: its Close closes kvs. The connection fields of opts
// (PDEndpoints, TLS, DialTimeout) are ignored.
func New(kvs *tikvclient.KVStore, opts Options) (*Store, error) {
	if kvs == nil {
		return nil, errors.New("tikv: new: nil client store")
	}
	if err := checkPrefix(opts.Prefix); err != nil {
		return nil, fmt.Errorf("tikv: new: %w", err)
	}
	logger := baseLogger(opts)
	routeClientLogs(logger)
	s := &Store{
		kvs:            kvs,
		log:            logger,
		prefix:         bytes.Clone(opts.Prefix),
		prefixEnd:      prefixEnd(opts.Prefix),
		requestTimeout: opts.RequestTimeout,
		regionStats:    opts.RegionStats,
		now:            opts.Clock,
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.requestTimeout == 0 {
		s.requestTimeout = defaultRequestTimeout
	}
	if opts.GCInterval > 0 {
		life := opts.GCLifeTime
		if life == 0 {
			life = defaultGCLifeTime
		}
		life = max(life, minGCLifeTime)
		s.gc = periodic.Start(opts.GCInterval, func(ctx context.Context) { s.runGC(ctx, life) })
	}
	return s, nil
}

func baseLogger(opts Options) *slog.Logger {
	if opts.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return opts.Logger.With("engine", "tikv")
}

// Features reports a durable engine whose ranges split along regions.
func (s *Store) Features() kv.Features {
	return kv.Features{Name: "tikv", Partitions: true, Durable: true}
}

// withTimeout applies RequestTimeout to ctx unless ctx ends sooner.
func (s *Store) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.requestTimeout < 0 {
		return ctx, func() {}
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= s.requestTimeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.requestTimeout)
}

// timestamp fetches a fresh timestamp from PD's TSO: every transaction
// that committed before the call has a smaller commit timestamp.
func (s *Store) timestamp(ctx context.Context) (uint64, error) {
	bo := tikvclient.NewBackofferWithVars(ctx, transaction.TsoMaxBackoff, nil)
	ts, err := s.kvs.GetTimestampWithRetry(bo, oracle.GlobalTxnScope)
	if err != nil {
		return 0, withCtx(ctx, fmt.Errorf("get timestamp from PD: %w", err))
	}
	return ts, nil
}

// Get returns a copy of key's value, or kv.ErrNotFound.
func (s *Store) Get(ctx context.Context, key []byte) ([]byte, error) {
	if err := s.gate.EnterKey(key); err != nil {
		return nil, err
	}
	defer s.gate.Exit()
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	ts, err := s.timestamp(ctx)
	if err != nil {
		return nil, fmt.Errorf("tikv: get %q: %w", key, err)
	}
	raw, err := s.kvs.GetSnapshot(ts).Get(ctx, s.dataKey(key))
	if tikverr.IsErrNotFound(err) {
		return nil, kv.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("tikv: get %q: %w", key, withCtx(ctx, err))
	}
	v, err := decodeValue(raw)
	if err != nil {
		return nil, fmt.Errorf("tikv: get %q: %w", key, err)
	}
	return bytes.Clone(v), nil
}

// Partitions splits [start, end) at the boundaries of the TiKV regions
// that hold it, as the region cache knows them. A stale cache only makes
// the split less even; the ranges always cover [start, end) exactly.
func (s *Store) Partitions(ctx context.Context, start, end []byte) ([]kv.Range, error) {
	if err := s.gate.Enter(); err != nil {
		return nil, err
	}
	defer s.gate.Exit()
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	lo, hi := s.dataKey(start), s.rangeEnd(end)
	var parts []kv.Range
	cur := bytes.Clone(start)
	cache := s.kvs.GetRegionCache()
	for key := lo; len(parts) < maxPartitions-1; {
		bo := tikvclient.NewBackofferWithVars(ctx, locateMaxBackoff, nil)
		loc, err := cache.LocateKey(bo, key)
		if err != nil {
			return nil, fmt.Errorf("tikv: partitions: locate region of %q: %w", key, withCtx(ctx, err))
		}
		b := loc.EndKey
		// An empty end key is the end of the keyspace; a boundary at or
		// past hi ends the range. Any boundary strictly inside
		// (lo, hi) lies in our namespace, because lo and hi do.
		if len(b) == 0 || bytes.Compare(b, hi) >= 0 {
			break
		}
		if bytes.Compare(b, key) <= 0 || !bytes.HasPrefix(b, s.prefix) {
			// Defensive: a cache answer that does not advance would
			// loop forever, and one outside the namespace cannot be
			// expressed as a user key. Stop splitting instead.
			break
		}
		next := bytes.Clone(b[len(s.prefix):])
		parts = append(parts, kv.Range{Start: cur, End: next})
		cur, key = next, b
	}
	return append(parts, kv.Range{Start: cur, End: bytes.Clone(end)}), nil
}

// Close stops GC, waits for in-flight calls and closes the client. Later
// calls return kv.ErrClosed.
func (s *Store) Close() error {
	if err := s.gate.Close(nil); err != nil {
		return err
	}
	// GC runs outside the gate (it can take long); stop it before
	// closing the client under it.
	s.gc.Stop()
	err := s.kvs.Close()
	if s.onClose != nil {
		s.onClose()
	}
	if err != nil {
		return fmt.Errorf("tikv: close: %w", err)
	}
	return nil
}

// dataKey returns key inside the namespace.
func (s *Store) dataKey(key []byte) []byte {
	k := make([]byte, len(s.prefix)+len(key))
	copy(k, s.prefix)
	copy(k[len(s.prefix):], key)
	return k
}

// rangeEnd returns the exclusive TiKV upper bound of a user range ending
// at end (nil or empty: the end of the namespace). It is never nil.
func (s *Store) rangeEnd(end []byte) []byte {
	if len(end) == 0 {
		return s.prefixEnd
	}
	return s.dataKey(end)
}

func checkPrefix(p []byte) error {
	if len(p) == 0 {
		return errors.New("a key prefix is required (e.g. \"engram/\")")
	}
	if prefixEnd(p) == nil {
		return fmt.Errorf("key prefix %q has no end (all 0xFF bytes)", p)
	}
	return nil
}

// prefixEnd returns the first key after every key starting with p, or nil
// if there is none (p empty or all 0xFF).
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xFF {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// encodeValue frames v for storage; the result is never empty.
func encodeValue(v []byte) []byte {
	out := make([]byte, 1+len(v))
	out[0] = valueTag
	copy(out[1:], v)
	return out
}

// decodeValue strips the framing. The result aliases raw.
func decodeValue(raw []byte) ([]byte, error) {
	if len(raw) == 0 || raw[0] != valueTag {
		return nil, fmt.Errorf("value not written by this adaptor (no 0x%02x tag): is another program writing under this prefix?", valueTag)
	}
	return raw[1:], nil
}

// withCtx adds the context's error to err when the context has ended:
// client-go reports an expired context as the backoff's last cause, which
// hides it from errors.Is.
func withCtx(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%w)", err, cerr)
	}
	return err
}
