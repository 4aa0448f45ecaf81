package sdk

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/engramkv/engram/wasm/abi"
)

// wrongStore answers with errors and sizes an op may not carry.
type wrongStore struct {
	fakeStore
	getErr    error
	value     []byte
	commitErr error
}

func (w *wrongStore) Get(context.Context, []byte) ([]byte, error) { return w.value, w.getErr }
func (w *wrongStore) Commit(context.Context, []Op) error          { return w.commitErr }
func (w *wrongStore) Scan(context.Context, ScanOptions) (Iterator, error) {
	return nil, fmt.Errorf("scan broke: %w", ErrNotFound)
}

func initDispatcher(t *testing.T, s Store, maxResp uint32) *dispatcher {
	t.Helper()
	d := newDispatcher(s)
	init := (&abi.InitRequest{MaxResponse: maxResp}).Append(nil)
	if resp := d.dispatch(abi.OpInit, init); resp[0] != byte(abi.StatusOK) {
		t.Fatalf("INIT: %x", resp)
	}
	return d
}

// status decodes a response's status and message.
func status(resp []byte) (abi.Status, string) {
	st := abi.Status(resp[0])
	if !st.HasMessage() {
		return st, ""
	}
	r := abi.NewReader(resp[1:])
	return st, string(r.Bytes())
}

// TestStatusesAnOpMayNotAnswer checks that a store's error never turns
// into a status the ABI forbids for the op (the host would discard the
// instance): UNCERTAIN outside COMMIT and NOT_FOUND outside GET become
// INTERNAL, naming what the store said.
func TestStatusesAnOpMayNotAnswer(t *testing.T) {
	s := &wrongStore{getErr: fmt.Errorf("lost track: %w", ErrUncertain), commitErr: fmt.Errorf("no such thing: %w", ErrNotFound)}
	d := initDispatcher(t, s, 0)
	get := (&abi.GetRequest{Key: []byte("k")}).Append(nil)
	if st, msg := status(d.dispatch(abi.OpGet, get)); st != abi.StatusInternal || !strings.Contains(msg, "UNCERTAIN") {
		t.Errorf("GET answered with ErrUncertain: %v %q, want INTERNAL naming it", st, msg)
	}
	commit := (&abi.CommitRequest{Ops: []abi.CommitOp{{Kind: abi.KindPut, Key: []byte("k")}}}).Append(nil)
	if st, msg := status(d.dispatch(abi.OpCommit, commit)); st != abi.StatusInternal || !strings.Contains(msg, "NOT_FOUND") {
		t.Errorf("COMMIT answered with ErrNotFound: %v %q, want INTERNAL naming it", st, msg)
	}
	scan := (&abi.ScanOpenRequest{Start: []byte("a")}).Append(nil)
	if st, _ := status(d.dispatch(abi.OpScanOpen, scan)); st != abi.StatusInternal {
		t.Errorf("SCAN_OPEN answered with ErrNotFound: %v, want INTERNAL", st)
	}
	// The statuses an op may answer pass through.
	s.commitErr = fmt.Errorf("timed out after sending: %w", ErrUncertain)
	if st, _ := status(d.dispatch(abi.OpCommit, commit)); st != abi.StatusUncertain {
		t.Errorf("COMMIT answered with ErrUncertain: %v, want UNCERTAIN", st)
	}
	s.getErr = ErrNotFound
	if st, _ := status(d.dispatch(abi.OpGet, get)); st != abi.StatusNotFound {
		t.Errorf("GET answered with ErrNotFound: %v, want NOT_FOUND", st)
	}
}

// TestResponsesOverTheHostsLimit checks that a value or a conflict's
// current value too large for the host's max_response is an INTERNAL error,
// not a response the host must refuse.
func TestResponsesOverTheHostsLimit(t *testing.T) {
	const limit = 1024
	s := &wrongStore{value: bytes.Repeat([]byte("v"), limit)}
	d := initDispatcher(t, s, limit)
	get := (&abi.GetRequest{Key: []byte("k")}).Append(nil)
	if st, msg := status(d.dispatch(abi.OpGet, get)); st != abi.StatusInternal || !strings.Contains(msg, "1024-byte response limit") {
		t.Errorf("GET of a value as large as the limit: %v %q", st, msg)
	}
	s.value = s.value[:limit-10]
	if resp := d.dispatch(abi.OpGet, get); resp[0] != byte(abi.StatusOK) || len(resp) > limit {
		t.Errorf("GET of a value that fits: status %d, %d bytes", resp[0], len(resp))
	}
	s.commitErr = &ConflictError{Index: 0, Exists: true, Current: bytes.Repeat([]byte("c"), limit)}
	commit := (&abi.CommitRequest{Ops: []abi.CommitOp{{Kind: abi.KindCompareAndSwap, Key: []byte("k")}}}).Append(nil)
	if st, msg := status(d.dispatch(abi.OpCommit, commit)); st != abi.StatusInternal || !strings.Contains(msg, "current value") {
		t.Errorf("conflict with a current value over the limit: %v %q", st, msg)
	}
}
