package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/engramkv/engram/abi"
	"github.com/engramkv/engram/core/kv"
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

// waiter is a goroutine waiting for an instance: any (want == nil), or the
// one holding its scan.
type waiter struct {
	ch   chan *instance
	want *instance
}

// Open starts a store on the plugin: it instantiates and INITs the pool,
// checks the manifest, and returns once every instance is ready. The
// result is a *Store, or a *SizedStore when the plugin declares SIZE.
func (p *Plugin) Open(ctx context.Context, opts StoreOptions) (Engine, error) {
	s, err := p.open(ctx, opts)
	if err != nil {
		return nil, err
	}
	return s.engine(), nil
}

func (p *Plugin) open(ctx context.Context, opts StoreOptions) (*Store, error) {
	s := &Store{p: p, opts: opts, log: p.log, allowed: map[string]struct{}{}}
	s.callTimeout = cmpOr(opts.CallTimeout, DefaultCallTimeout)
	s.abortGrace = cmpOr(opts.AbortGrace, DefaultAbortGrace)
	s.maxResponse = cmpOr(opts.MaxResponse, DefaultMaxResponse)
	for _, a := range opts.AllowedAddresses {
		s.allowed[a] = struct{}{}
	}
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	first, err := s.startInstance(ctx, 0)
	if err != nil {
		s.bgCancel()
		return nil, err
	}
	s.met = p.metrics.forStore(s.manifest.Name)
	s.log = p.log.With("engine", s.manifest.Name)
	s.size = 1
	if s.manifest.Model == abi.ModelPooled {
		s.size = cmpOr(opts.PoolSize, DefaultPoolSize)
		if m := int(s.manifest.MaxInstances); m > 0 && s.size > m {
			s.log.Warn("pool size capped by the plugin's manifest", "requested", s.size, "max_instances", m)
			s.size = m
		}
	} else if opts.PoolSize > 1 {
		s.log.Info("plugin keeps its data in its own memory (instance model single): running one instance", "pool_size", opts.PoolSize)
	}
	s.idle = append(s.idle, first)
	s.live = 1
	for i := 1; i < s.size; i++ {
		in, err := s.startInstance(ctx, i)
		if err != nil {
			s.bgCancel()
			for _, in := range s.idle {
				in.discard()
			}
			return nil, err
		}
		s.idle = append(s.idle, in)
		s.live++
	}
	s.met.instances.Set(float64(s.live))
	s.updateMemory()
	if s.manifest.Supports(abi.OpIdle) && opts.IdleInterval >= 0 {
		s.bg.Add(1)
		go s.idleLoop(cmpOr(opts.IdleInterval, DefaultIdleInterval))
	}
	s.log.Info("wasm plugin store open", "version", s.manifest.Version, "model", s.manifest.Model.String(),
		"instances", s.size, "features", s.Features())
	return s, nil
}

// OpenFile loads the plugin at path and opens a store that owns it: closing
// the store closes the plugin. The result is as Open's.
func OpenFile(ctx context.Context, path string, opts Options, sopts StoreOptions) (Engine, error) {
	p, err := Load(ctx, path, opts)
	if err != nil {
		return nil, err
	}
	s, err := p.open(ctx, sopts)
	if err != nil {
		_ = p.Close(context.Background())
		return nil, err
	}
	s.ownsPlugin = true
	return s.engine(), nil
}

func cmpOr[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// startInstance instantiates and INITs one instance. The first one's
// manifest becomes the store's; later ones must declare the same engine.
func (s *Store) startInstance(ctx context.Context, index int) (*instance, error) {
	in, err := s.p.newInstance(ctx, s, index)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	dl := s.deadlineAt(ctx, now)
	flags := uint64(0)
	if len(s.allowed) > 0 {
		flags |= abi.HostFlagNet
	}
	req := abi.InitRequest{
		Header:      abi.Header{Deadline: dl.UnixNano()},
		Config:      s.opts.Config,
		HostFlags:   flags,
		Instance:    uint32(index),
		MaxResponse: uint32(s.maxResponse),
	}
	in.scratch = req.Append(in.scratch[:0])
	st, body, f := in.roundTrip(ctx, abi.OpInit, in.scratch, now, dl)
	if f != nil {
		in.discard()
		return nil, fmt.Errorf("wasm plugin %s: INIT: %s: %w", s.p.name, f.kind, f.err)
	}
	if st != abi.StatusOK {
		// Format before discarding: msg aliases guest memory, which is
		// unmapped with the instance.
		msg, _ := abi.DecodeMessage(body)
		err := fmt.Errorf("wasm plugin %s refused its configuration: INIT answered %v: %s", s.p.name, st, msg)
		in.discard()
		return nil, err
	}
	var m abi.Manifest
	if err := m.Decode(body); err != nil {
		in.discard()
		return nil, fmt.Errorf("wasm plugin %s: INIT: malformed manifest: %w", s.p.name, err)
	}
	if err := checkManifest(&m); err != nil {
		in.discard()
		return nil, fmt.Errorf("wasm plugin %s: manifest: %w", s.p.name, err)
	}
	in.lastCall = monotonic()
	if s.manifest.Name == "" {
		s.manifest = m
	} else if m.Name != s.manifest.Name || m.Model != s.manifest.Model {
		in.discard()
		return nil, fmt.Errorf("wasm plugin %s: instance %d declared engine %q (%v), the first declared %q (%v)",
			s.p.name, index, m.Name, m.Model, s.manifest.Name, s.manifest.Model)
	}
	return in, nil
}

func checkManifest(m *abi.Manifest) error {
	var errs []error
	if m.Name == "" {
		errs = append(errs, errors.New("empty name"))
	}
	if m.Model != abi.ModelSingle && m.Model != abi.ModelPooled {
		errs = append(errs, fmt.Errorf("unknown instance model %d (want 1 single or 2 pooled)", m.Model))
	}
	if missing := abi.RequiredOps &^ m.Ops; missing != 0 {
		var names []string
		for op := abi.OpInit; op <= abi.MaxOp; op++ {
			if missing&op.Bit() != 0 {
				names = append(names, op.String())
			}
		}
		errs = append(errs, fmt.Errorf("required ops missing: %v", names))
	}
	return errors.Join(errs...)
}

// Manifest returns what the plugin declared at INIT.
func (s *Store) Manifest() abi.Manifest { return s.manifest }

// deadlineAt is a call's effective deadline: the context's, or
// CallTimeout from now, whichever is earlier.
func (s *Store) deadlineAt(ctx context.Context, now time.Time) time.Time {
	dl := now.Add(s.callTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		return d
	}
	return dl
}

// acquire takes an instance for one call: any idle one, or want (the
// instance holding a scan) when it is not nil.
func (s *Store) acquire(ctx context.Context, want *instance) (*instance, error) {
	s.mu.Lock()
	if err := s.unusable(want); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if want != nil {
		for i, in := range s.idle {
			if in == want {
				s.idle = append(s.idle[:i], s.idle[i+1:]...)
				s.busy++
				s.mu.Unlock()
				return in, nil
			}
		}
	} else if n := len(s.idle); n > 0 {
		in := s.idle[n-1]
		s.idle = s.idle[:n-1]
		s.busy++
		s.mu.Unlock()
		return in, nil
	}
	w := &waiter{ch: make(chan *instance, 1), want: want}
	s.waiters = append(s.waiters, w)
	s.mu.Unlock()
	select {
	case in := <-w.ch:
		if in == nil {
			s.mu.Lock()
			defer s.mu.Unlock()
			if err := s.unusable(want); err != nil {
				return nil, err
			}
			return nil, kv.ErrClosed
		}
		return in, nil
	case <-ctx.Done():
		s.mu.Lock()
		for i, x := range s.waiters {
			if x == w {
				s.waiters = append(s.waiters[:i], s.waiters[i+1:]...)
				s.mu.Unlock()
				return nil, fmt.Errorf("wasm plugin %s: waiting for a free instance: %w", s.manifest.Name, ctx.Err())
			}
		}
		s.mu.Unlock()
		// Handed over just as the context ended: give it back.
		if in := <-w.ch; in != nil {
			s.release(in)
		}
		return nil, fmt.Errorf("wasm plugin %s: waiting for a free instance: %w", s.manifest.Name, ctx.Err())
	}
}

// unusable reports why no instance can be had (under s.mu).
func (s *Store) unusable(want *instance) error {
	switch {
	case s.closed:
		return kv.ErrClosed
	case s.lost:
		return fmt.Errorf("wasm plugin %s: %w", s.manifest.Name, ErrStateLost)
	case want != nil && want.dead:
		return fmt.Errorf("wasm plugin %s: %w", s.manifest.Name, ErrScanLost)
	}
	return nil
}

// release returns an instance after a call. A dead one is discarded and,
// for a pooled plugin, replaced in the background.
func (s *Store) release(in *instance) {
	s.mu.Lock()
	s.busy--
	if in.dead {
		s.live--
		s.met.instances.Set(float64(s.live))
		// Scans pinned to it fail; a single-instance store is lost.
		kept := s.waiters[:0]
		for _, w := range s.waiters {
			if w.want == in || s.manifest.Model == abi.ModelSingle {
				w.ch <- nil
				continue
			}
			kept = append(kept, w)
		}
		clear(s.waiters[len(kept):])
		s.waiters = kept
		if s.manifest.Model == abi.ModelSingle {
			s.lost = true
		} else if !s.closed {
			s.bg.Add(1)
			go s.replace(in.index)
		}
		s.checkDrained()
		s.mu.Unlock()
		in.discard()
		s.updateMemory()
		return
	}
	handed := s.handOff(in)
	s.checkDrained()
	s.mu.Unlock()
	if handed {
		// The waiter was made runnable next on this P, but would only
		// run once this goroutine blocks or is preempted, up to 10 ms
		// later, while the instance sits idle; yielding runs the waiter
		// now (DESIGN.md, "Instance models").
		runtime.Gosched()
	}
}

// handOff gives a live instance to a waiter, preferring one pinned to it,
// or parks it as idle (under s.mu). It reports whether a waiter got it.
func (s *Store) handOff(in *instance) bool {
	pick := -1
	for i, w := range s.waiters {
		if w.want == in {
			pick = i
			break
		}
		if w.want == nil && pick < 0 {
			pick = i
		}
	}
	if pick >= 0 {
		w := s.waiters[pick]
		s.waiters = append(s.waiters[:pick], s.waiters[pick+1:]...)
		s.busy++
		w.ch <- in
		return true
	}
	s.idle = append(s.idle, in)
	return false
}

func (s *Store) checkDrained() {
	if s.closed && s.busy == 0 && s.drained != nil {
		close(s.drained)
		s.drained = nil
	}
}

// replace starts a new instance in place of a discarded one, retrying with
// backoff while INIT fails (a remote engine may be down).
func (s *Store) replace(index int) {
	defer s.bg.Done()
	backoff := 50 * time.Millisecond
	for s.bgCtx.Err() == nil {
		ctx, cancel := context.WithTimeout(s.bgCtx, s.callTimeout)
		in, err := s.startInstance(ctx, index)
		cancel()
		if err == nil {
			s.replacements.Add(1)
			s.met.replacements.Inc()
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				in.discard()
				return
			}
			s.live++
			s.met.instances.Set(float64(s.live))
			s.handOff(in)
			s.mu.Unlock()
			s.updateMemory()
			s.log.Info("wasm plugin instance replaced", "instance", index)
			return
		}
		s.log.Error("cannot start a replacement wasm plugin instance; retrying", "instance", index, "err", err, "retry_in", backoff)
		select {
		case <-s.bgCtx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// idleLoop sends IDLE to instances idle for longer than interval, so a
// garbage-collected guest collects while nobody waits for it.
func (s *Store) idleLoop(interval time.Duration) {
	defer s.bg.Done()
	t := time.NewTicker(max(interval/2, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-s.bgCtx.Done():
			return
		case <-t.C:
		}
		cutoff := monotonic() - int64(interval)
		s.mu.Lock()
		var due []*instance
		kept := s.idle[:0]
		for _, in := range s.idle {
			if in.lastCall < cutoff && len(s.waiters) == 0 && !s.closed {
				due = append(due, in)
				s.busy++
				continue
			}
			kept = append(kept, in)
		}
		clear(s.idle[len(kept):])
		s.idle = kept
		s.mu.Unlock()
		for _, in := range due {
			ctx, cancel := context.WithTimeout(s.bgCtx, time.Second)
			st, body, err := s.call(ctx, in, abi.OpIdle, func(b []byte, h abi.Header) []byte {
				return (&abi.EmptyRequest{Header: h}).Append(b)
			})
			cancel()
			if err == nil && (st != abi.StatusOK || len(body) != 0) {
				s.log.Debug("plugin answered IDLE with an error", "status", st.String())
			}
			s.release(in)
		}
	}
}

// updateMemory refreshes the memory gauge from the instances' last sizes.
func (s *Store) updateMemory() {
	s.mu.Lock()
	var total int64
	for _, in := range s.idle {
		total += in.memSize.Load()
	}
	busy := s.busy
	s.mu.Unlock()
	if busy == 0 {
		s.met.memory.Set(float64(total))
	}
}

// call encodes a request into the instance's scratch buffer with encode,
// sends it, and returns the response, which aliases guest memory until the
// instance is released. A failure discards the instance (at release) and is
// returned as an *Error.
func (s *Store) call(ctx context.Context, in *instance, op abi.Op, encode func(b []byte, h abi.Header) []byte) (abi.Status, []byte, error) {
	now := time.Now()
	return s.callUntil(ctx, in, op, now, s.deadlineAt(ctx, now), encode)
}

// callUntil is call with the deadline dl instead of the store's call
// timeout, for calls that may rightly run longer (RECLAIM).
func (s *Store) callUntil(ctx context.Context, in *instance, op abi.Op, now, dl time.Time, encode func(b []byte, h abi.Header) []byte) (abi.Status, []byte, error) {
	in.scratch = encode(in.scratch[:0], abi.Header{Deadline: dl.UnixNano()})
	st, body, f := in.roundTrip(ctx, op, in.scratch, now, dl)
	took := time.Since(now)
	in.lastCall = int64(now.Sub(clockBase) + took)
	om := &s.met.ops[op]
	om.calls.Inc()
	om.latency.Observe(took.Seconds())
	if f != nil {
		s.instanceFailed(in, op, f.kind, f.err)
		return 0, nil, &Error{Plugin: s.manifest.Name, Op: op, Kind: f.kind, Err: f.err, Uncertain: op == abi.OpCommit && f.delivered}
	}
	return st, body, nil
}

func (s *Store) instanceFailed(in *instance, op abi.Op, kind errorKind, err error) {
	in.dead = true
	s.failures.Add(1)
	s.met.traps.Inc()
	s.met.failed(op, kind)
	s.log.Error("wasm plugin instance failed; discarding it", "instance", in.index, "op", op.String(), "kind", kind.String(), "err", err)
}

// protocolErr discards an instance whose response body did not decode.
func (s *Store) protocolErr(in *instance, op abi.Op, err error) error {
	s.instanceFailed(in, op, kindProtocol, err)
	return &Error{Plugin: s.manifest.Name, Op: op, Kind: kindProtocol, Err: err, Uncertain: op == abi.OpCommit}
}

// statusErr turns a non-OK status into an error. A status the op does not
// allow, or a malformed message, breaks the ABI.
func (s *Store) statusErr(in *instance, op abi.Op, st abi.Status, body []byte) error {
	allowed := st.HasMessage() && (st != abi.StatusUncertain || op == abi.OpCommit)
	if !allowed {
		return s.protocolErr(in, op, fmt.Errorf("status %v is not a valid answer to %v", st, op))
	}
	msg, err := abi.DecodeMessage(body)
	if err != nil {
		return s.protocolErr(in, op, fmt.Errorf("%v message: %w", st, err))
	}
	s.met.failed(op, kindStatus)
	return &Error{Plugin: s.manifest.Name, Op: op, Kind: kindStatus, Status: st, Err: errors.New(string(msg)),
		Uncertain: st == abi.StatusUncertain}
}

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
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return kv.ErrClosed
	}
	s.closed = true
	for _, w := range s.waiters {
		w.ch <- nil
	}
	s.waiters = nil
	var drained chan struct{}
	if s.busy > 0 {
		drained = make(chan struct{})
		s.drained = drained
	}
	s.mu.Unlock()
	s.bgCancel()
	if drained != nil {
		<-drained
	}
	s.bg.Wait()
	s.mu.Lock()
	idle := s.idle
	s.idle = nil
	s.live = 0
	s.mu.Unlock()
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

// Stats is a snapshot of a store's pool, for tests and diagnostics.
type Stats struct {
	// Instances is the number of live instances.
	Instances int
	// Busy is the number of instances serving a call.
	Busy int
	// Failures counts instances discarded after a failure.
	Failures int64
	// Replacements counts instances started in place of discarded ones.
	Replacements int64
	// Lost is true when a single-instance plugin's instance died.
	Lost bool
}

// Stats returns a snapshot of the pool.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Instances: s.live, Busy: s.busy, Failures: s.failures.Load(), Replacements: s.replacements.Load(), Lost: s.lost}
}

var _ kv.Store = (*Store)(nil)
