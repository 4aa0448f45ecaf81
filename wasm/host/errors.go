package host

import (
	"context"
	"errors"
	"fmt"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/wasm/abi"
)

var (
	// ErrCrashed marks a call whose instance trapped or failed: the
	// instance was discarded.
	ErrCrashed = errors.New("wasm plugin instance crashed")
	// ErrProtocol marks a call whose response broke the ABI (garbage, a
	// wrong length, an unknown status): the instance was discarded.
	ErrProtocol = errors.New("wasm plugin broke the ABI")
	// ErrUnavailable marks an UNAVAILABLE answer: the plugin's engine is
	// unreachable; nothing was applied and a retry may succeed.
	ErrUnavailable = errors.New("wasm plugin engine unavailable")
	// ErrInvalid marks an INVALID answer: the plugin refused the request.
	ErrInvalid = errors.New("wasm plugin refused the request as invalid")
	// ErrInternal marks an INTERNAL answer.
	ErrInternal = errors.New("wasm plugin internal error")
	// ErrStateLost is returned (wrapping kv.ErrClosed) by every call on a
	// single-instance plugin's store after its instance crashed: its data
	// lived in the instance's memory, and serving on from an empty
	// replacement would silently lose every key.
	ErrStateLost = fmt.Errorf("%w: the wasm plugin's only instance crashed and its in-memory data is lost", kv.ErrClosed)
	// ErrScanLost is returned by an iterator whose instance was discarded.
	ErrScanLost = errors.New("wasm plugin instance holding this scan was discarded")
)

// errorKind classifies call errors for messages and metrics.
type errorKind uint8

const (
	kindStatus   errorKind = iota // the plugin answered a non-OK status
	kindTrap                      // the call trapped or returned an error
	kindDeadline                  // the call overran its deadline and was unwound
	kindProtocol                  // the response broke the ABI
	kindRefused                   // the host refused to send the request
)

func (k errorKind) String() string {
	switch k {
	case kindStatus:
		return "status"
	case kindTrap:
		return "trap"
	case kindDeadline:
		return "deadline"
	case kindProtocol:
		return "protocol"
	case kindRefused:
		return "refused"
	}
	return "unknown"
}

// Error is a failed plugin call. errors.Is sees through it to kv's errors
// (kv.ErrUncertain, kv.ErrUnsupported), context.DeadlineExceeded for
// deadlines, and this package's sentinels.
type Error struct {
	Plugin string
	Op     abi.Op
	Kind   errorKind
	// Status is the plugin's answer for kind status.
	Status abi.Status
	// Err is the cause: the plugin's message or the host's finding.
	Err error
	// Uncertain is set for a COMMIT whose outcome is unknown.
	Uncertain bool
}

func (e *Error) Error() string {
	what := ""
	switch e.Kind {
	case kindStatus:
		what = e.Status.String()
	case kindTrap:
		what = "instance crashed, replaced"
	case kindDeadline:
		what = "deadline exceeded, instance replaced"
	case kindProtocol:
		what = "broke the ABI, instance replaced"
	case kindRefused:
		what = "refused by the host"
	}
	s := fmt.Sprintf("wasm plugin %s: %v: %s: %v", e.Plugin, e.Op, what, e.Err)
	if e.Uncertain {
		s += " (commit outcome unknown)"
	}
	return s
}

// Unwrap exposes the sentinels callers test with errors.Is.
func (e *Error) Unwrap() []error {
	errs := []error{e.Err}
	if e.Uncertain {
		errs = append(errs, kv.ErrUncertain)
	}
	switch e.Kind {
	case kindTrap:
		errs = append(errs, ErrCrashed)
	case kindDeadline:
		errs = append(errs, ErrCrashed, context.DeadlineExceeded)
	case kindProtocol:
		errs = append(errs, ErrProtocol)
	case kindStatus:
		switch e.Status {
		case abi.StatusUnsupported:
			errs = append(errs, kv.ErrUnsupported)
		case abi.StatusDeadline:
			errs = append(errs, context.DeadlineExceeded)
		case abi.StatusUnavailable:
			errs = append(errs, ErrUnavailable)
		case abi.StatusInvalid:
			errs = append(errs, ErrInvalid)
		case abi.StatusInternal:
			errs = append(errs, ErrInternal)
		}
	}
	return errs
}
