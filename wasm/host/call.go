package host

// This file is one call to an instance: its deadline, the round trip, the
// per-op metrics, and how a failed or refused call becomes an *Error.
//
// Invariants: a call's deadline is never later than CallTimeout from its
// start; any failure of the round trip, and any response that breaks the ABI
// (protocolErr), marks the instance dead, so release discards it; a COMMIT
// whose request may have reached the plugin is reported Uncertain, never as
// not applied.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/engramkv/engram/wasm/abi"
)

// deadlineAt is a call's effective deadline: the context's, or
// CallTimeout from now, whichever is earlier.
func (s *Store) deadlineAt(ctx context.Context, now time.Time) time.Time {
	dl := now.Add(s.callTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		return d
	}
	return dl
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
