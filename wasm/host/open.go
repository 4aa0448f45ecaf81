package host

// This file opens a store: it starts and INITs the pool's instances and
// checks what they declare.
//
// Invariants: the store's manifest is the first instance's, and every later
// instance (including replacements) must declare the same engine name and
// instance model or is discarded; Open returns only once every instance of
// the pool answered INIT, and on any failure discards what it started.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/engramkv/engram/wasm/abi"
)

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
