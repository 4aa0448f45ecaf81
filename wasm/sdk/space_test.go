package sdk

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/engramkv/engram/wasm/abi"
)

// spaceStore is a fakeStore that is also a Sizer and a Reclaimer.
type spaceStore struct {
	fakeStore
	size       int64
	sizeErr    error
	reclaimErr error
	reclaims   int
	deadline   time.Time
}

func (s *spaceStore) Size(context.Context) (int64, error) { return s.size, s.sizeErr }

func (s *spaceStore) Reclaim(ctx context.Context) error {
	s.reclaims++
	s.deadline, _ = ctx.Deadline()
	return s.reclaimErr
}

// TestSpaceOps: a Store that implements Sizer and Reclaimer declares SIZE
// and RECLAIM and answers the golden requests with the golden bytes; its
// errors map to statuses; one that implements neither declares neither and
// answers UNSUPPORTED if asked anyway.
func TestSpaceOps(t *testing.T) {
	vec := goldenVectors(t)
	s := &spaceStore{size: 5 << 30}
	d := initDispatcher(t, s, 0)
	m := d.manifest
	if !m.Supports(abi.OpSize) || !m.Supports(abi.OpReclaim) || m.ABIMinor != abi.Minor {
		t.Fatalf("manifest ops %#x, abi_minor %d: want SIZE and RECLAIM declared, minor %d", m.Ops, m.ABIMinor, abi.Minor)
	}
	if resp := d.dispatch(abi.OpSize, vec["size-request"]); !bytes.Equal(resp, vec["size-response"]) {
		t.Errorf("SIZE: %x, want %x", resp, vec["size-response"])
	}
	if resp := d.dispatch(abi.OpReclaim, vec["reclaim-request"]); !bytes.Equal(resp, vec["reclaim-response-ok"]) {
		t.Errorf("RECLAIM: %x, want %x", resp, vec["reclaim-response-ok"])
	}
	if s.reclaims != 1 || s.deadline.UnixNano() != 1700000000000000000 {
		t.Errorf("Reclaim called %d times with deadline %v, want once with the request's", s.reclaims, s.deadline)
	}
	s.reclaimErr = context.DeadlineExceeded
	if resp := d.dispatch(abi.OpReclaim, vec["reclaim-request"]); resp[0] != byte(abi.StatusDeadline) {
		t.Errorf("RECLAIM past its deadline: %x, want DEADLINE", resp)
	}
	s.sizeErr = errors.Join(ErrUnavailable, errors.New("server gone"))
	if resp := d.dispatch(abi.OpSize, vec["size-request"]); resp[0] != byte(abi.StatusUnavailable) {
		t.Errorf("SIZE of an unreachable engine: %x, want UNAVAILABLE", resp)
	}
	s.sizeErr = ErrNotFound // not an answer SIZE may give
	if resp := d.dispatch(abi.OpSize, vec["size-request"]); resp[0] != byte(abi.StatusInternal) {
		t.Errorf("SIZE failing with ErrNotFound: %x, want INTERNAL", resp)
	}
	s.sizeErr, s.size = nil, -1
	if resp := d.dispatch(abi.OpSize, vec["size-request"]); !bytes.Equal(resp, abi.AppendSize(nil, 0)) {
		t.Errorf("SIZE of -1: %x, want 0", resp)
	}
	if resp := d.dispatch(abi.OpSize, append(vec["size-request"], 0)); resp[0] != byte(abi.StatusInvalid) {
		t.Errorf("SIZE with a trailing byte: %x, want INVALID", resp)
	}

	plain := initDispatcher(t, &fakeStore{}, 0)
	m = plain.manifest
	if m.Supports(abi.OpSize) || m.Supports(abi.OpReclaim) {
		t.Errorf("a plain store declared ops %#x", m.Ops)
	}
	for _, op := range []abi.Op{abi.OpSize, abi.OpReclaim} {
		if resp := plain.dispatch(op, vec["size-request"]); resp[0] != byte(abi.StatusUnsupported) {
			t.Errorf("%v to a plain store: %x, want UNSUPPORTED", op, resp)
		}
	}
}
