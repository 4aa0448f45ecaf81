package host

// This file is the kv.Store face of a plugin: the Store type and the
// kv.Store methods that are one round trip each (Scan is in scan.go, Reclaim
// in reclaim.go). Opening is in open.go, the instance pool in pool.go, one
// call's deadline and error classification in call.go.
//
// Invariants: every method takes an instance with acquire and gives it back
// with release (deferred), and calls into no other instance meanwhile; a
// response body aliases guest memory until that release, so everything a
// method returns is copied out of it first; a closed store answers
// kv.ErrClosed without calling the plugin (acquire refuses it at the latest).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/wasm/abi"
)

// Defaults of StoreOptions.
const (
	DefaultPoolSize     = 4
	DefaultCallTimeout  = 10 * time.Second
	DefaultAbortGrace   = time.Second
	DefaultMaxResponse  = 64 << 20
	DefaultIdleInterval = 10 * time.Second
	defaultScanBatch    = 256
	closeTimeout        = 5 * time.Second
)

// StoreOptions configure one store: the plugin's configuration and the pool.
type StoreOptions struct {
	// Config is passed verbatim to every instance's INIT.
	Config []byte
	// PoolSize is the number of instances of a pooled plugin (capped by
	// its manifest's max_instances); 0 means DefaultPoolSize. A
	// single-instance plugin always gets one.
	PoolSize int
	// AllowedAddresses are the host:port strings net_dial may connect to;
	// anything else is DENIED.
	AllowedAddresses []string
	// CallTimeout bounds every call whose context has no earlier deadline
	// (the core's writer calls without one); 0 means DefaultCallTimeout.
	CallTimeout time.Duration
	// AbortGrace is how long past its deadline a call may run to unwind
	// cleanly (its sockets already time out at the deadline) before the
	// host unwinds it at its next host call and discards the instance; 0
	// means DefaultAbortGrace.
	AbortGrace time.Duration
	// MaxResponse caps a response's size; 0 means DefaultMaxResponse.
	MaxResponse int
	// IdleInterval is how long an instance must be idle before the host
	// sends it IDLE (GC and housekeeping); 0 means DefaultIdleInterval,
	// negative disables.
	IdleInterval time.Duration
}

// Store serves a plugin as a kv.Store through a pool of instances.
type Store struct {
	p           *Plugin
	ownsPlugin  bool
	log         *slog.Logger
	opts        StoreOptions
	manifest    abi.Manifest
	met         *storeMetrics
	allowed     map[string]struct{}
	callTimeout time.Duration
	abortGrace  time.Duration
	maxResponse int
	size        int

	// The pool (pool.go): bg counts its background goroutines
	// (replacements, the idle loop), which end when bgCtx does; mu guards
	// the fields after it.
	bgCtx    context.Context
	bgCancel context.CancelFunc
	bg       sync.WaitGroup

	mu      sync.Mutex
	idle    []*instance
	live    int
	busy    int
	waiters []*waiter
	closed  bool
	lost    bool
	drained chan struct{}

	failures     atomic.Int64
	replacements atomic.Int64
}

// Manifest returns what the plugin declared at INIT.
func (s *Store) Manifest() abi.Manifest { return s.manifest }

// Features implements kv.Store.
func (s *Store) Features() kv.Features {
	return kv.Features{
		Name:       s.manifest.Name,
		Partitions: s.manifest.Features&abi.FeaturePartitions != 0 && s.manifest.Supports(abi.OpPartitions),
		Durable:    s.manifest.Features&abi.FeatureDurable != 0,
		NativeTTL:  s.manifest.Features&abi.FeatureNativeTTL != 0,
	}
}

// Get implements kv.Store.
func (s *Store) Get(ctx context.Context, key []byte) ([]byte, error) {
	in, err := s.acquire(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer s.release(in)
	st, body, err := s.call(ctx, in, abi.OpGet, func(b []byte, h abi.Header) []byte {
		return (&abi.GetRequest{Header: h, Key: key}).Append(b)
	})
	if err != nil {
		return nil, err
	}
	switch st {
	case abi.StatusOK:
		v, err := abi.DecodeValue(body)
		if err != nil {
			return nil, s.protocolErr(in, abi.OpGet, fmt.Errorf("value: %w", err))
		}
		return append([]byte{}, v...), nil
	case abi.StatusNotFound:
		if len(body) != 0 {
			return nil, s.protocolErr(in, abi.OpGet, errors.New("NOT_FOUND with a body"))
		}
		return nil, kv.ErrNotFound
	}
	return nil, s.statusErr(in, abi.OpGet, st, body)
}

// Commit implements kv.Store. Malformed batches and batches over the
// plugin's declared limits are refused without being sent (certainly not
// applied); a failure after the request reached the plugin is uncertain.
func (s *Store) Commit(ctx context.Context, ops []kv.Op) error {
	if s.isClosed() {
		return kv.ErrClosed
	}
	if len(ops) == 0 {
		return nil
	}
	if err := kv.ValidateBatch(ops); err != nil {
		return err
	}
	if m := int(s.manifest.MaxCommitOps); m > 0 && len(ops) > m {
		s.met.failed(abi.OpCommit, kindRefused)
		return &Error{Plugin: s.manifest.Name, Op: abi.OpCommit, Kind: kindRefused,
			Err: fmt.Errorf("batch of %d ops exceeds the plugin's limit of %d", len(ops), m)}
	}
	if m := int(s.manifest.MaxCommitBytes); m > 0 {
		n := 0
		for i := range ops {
			n += abi.CommitOpLen(abi.OpKind(ops[i].Kind), ops[i].Key, ops[i].Value, ops[i].Expected)
		}
		if n > m {
			s.met.failed(abi.OpCommit, kindRefused)
			return &Error{Plugin: s.manifest.Name, Op: abi.OpCommit, Kind: kindRefused,
				Err: fmt.Errorf("batch of about %d bytes exceeds the plugin's limit of %d", n, m)}
		}
	}
	in, err := s.acquire(ctx, nil)
	if err != nil {
		return err
	}
	defer s.release(in)
	st, body, err := s.call(ctx, in, abi.OpCommit, func(b []byte, h abi.Header) []byte {
		b = abi.AppendCommitHead(b, h, len(ops))
		for i := range ops {
			op := &ops[i]
			b = abi.AppendCommitOp(b, abi.OpKind(op.Kind), op.Key, op.Value, op.Expected)
		}
		return b
	})
	if err != nil {
		return err
	}
	switch st {
	case abi.StatusOK:
		if err := abi.DecodeEmpty(body); err != nil {
			return s.protocolErr(in, abi.OpCommit, err)
		}
		return nil
	case abi.StatusConflict:
		index, exists, cur, err := abi.DecodeConflict(body)
		if err != nil {
			return s.protocolErr(in, abi.OpCommit, fmt.Errorf("conflict: %w", err))
		}
		if int(index) >= len(ops) || !ops[index].Kind.Conditional() {
			return s.protocolErr(in, abi.OpCommit, fmt.Errorf("conflict names op %d, which is not a conditional op of the %d-op batch", index, len(ops)))
		}
		ce := &kv.ConflictError{Index: int(index), Key: append([]byte{}, ops[index].Key...), Exists: exists}
		if exists {
			ce.Current = append([]byte{}, cur...)
		}
		return ce
	}
	return s.statusErr(in, abi.OpCommit, st, body)
}

// Partitions implements kv.Store.
func (s *Store) Partitions(ctx context.Context, start, end []byte) ([]kv.Range, error) {
	if s.isClosed() {
		return nil, kv.ErrClosed
	}
	if !s.manifest.Supports(abi.OpPartitions) {
		return []kv.Range{{Start: append([]byte(nil), start...), End: append([]byte(nil), end...)}}, nil
	}
	in, err := s.acquire(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer s.release(in)
	st, body, err := s.call(ctx, in, abi.OpPartitions, func(b []byte, h abi.Header) []byte {
		return (&abi.PartitionsRequest{Header: h, Start: start, End: end}).Append(b)
	})
	if err != nil {
		return nil, err
	}
	if st != abi.StatusOK {
		return nil, s.statusErr(in, abi.OpPartitions, st, body)
	}
	ranges, err := abi.DecodePartitions(body, nil)
	if err != nil {
		return nil, s.protocolErr(in, abi.OpPartitions, err)
	}
	out := make([]kv.Range, len(ranges))
	for i, r := range ranges {
		out[i] = kv.Range{Start: append([]byte(nil), r.Start...), End: append([]byte(nil), r.End...)}
	}
	return out, nil
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close implements kv.Store: it waits for in-flight calls, sends CLOSE to
// every instance and discards them.
func (s *Store) Close() error {
	idle, ok := s.drain()
	if !ok {
		return kv.ErrClosed
	}
	var errs []error
	for _, in := range idle {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		st, body, err := s.call(ctx, in, abi.OpClose, func(b []byte, h abi.Header) []byte {
			return (&abi.EmptyRequest{Header: h}).Append(b)
		})
		cancel()
		if err == nil && st != abi.StatusOK {
			msg, _ := abi.DecodeMessage(body)
			err = fmt.Errorf("wasm plugin %s: CLOSE answered %v: %s", s.manifest.Name, st, msg)
		}
		if err != nil {
			errs = append(errs, err)
		}
		in.discard()
	}
	s.met.instances.Set(0)
	s.met.memory.Set(0)
	if s.ownsPlugin {
		if err := s.p.Close(context.Background()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

var _ kv.Store = (*Store)(nil)
