package host

// This file is the instance pool: how a call gets an instance (acquire),
// gives it back (release, handOff), how a discarded one is replaced, how
// idle ones get IDLE, and how the pool drains at Close.
//
// Invariants, all under s.mu: live == len(idle) + busy until drain empties
// the pool (an instance taken by acquire, or by idleLoop for IDLE, counts
// as busy until release); an instance is in idle, held by exactly one
// goroutine, or in flight to exactly one waiter's channel, never two of
// these; a waiter with want != nil only ever receives that instance (or nil
// when it died); a dead instance never returns to idle: release discards it
// and, for a pooled plugin not closing, starts one replacement, while a
// single-instance store is marked lost and fails every later call; nothing
// is handed out once closed is set.

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/wasm/abi"
)

// waiter is a goroutine waiting for an instance: any (want == nil), or the
// one holding its scan.
type waiter struct {
	ch   chan *instance
	want *instance
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

// drain closes the pool: it fails every waiter, waits for the calls in
// flight and the background work (replacements, IDLE) to end, and returns
// the idle instances, now owned by the caller. ok is false when the pool
// was already closed.
func (s *Store) drain() (idle []*instance, ok bool) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, false
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
	idle = s.idle
	s.idle = nil
	s.live = 0
	s.mu.Unlock()
	return idle, true
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
