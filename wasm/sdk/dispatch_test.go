package sdk

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/engramkv/engram/wasm/abi"
)

// fakeStore records what the dispatcher decoded and answers like the golden
// vectors' responses.
type fakeStore struct {
	lastKey []byte
	lastOps []Op
	scan    ScanOptions
	config  []byte
}

func (f *fakeStore) Init(_ context.Context, config []byte, _ HostInfo) (Manifest, error) {
	f.config = bytes.Clone(config)
	return Manifest{Name: "fake", Version: "1", Model: ModelPooled}, nil
}

func (f *fakeStore) Get(_ context.Context, key []byte) ([]byte, error) {
	f.lastKey = bytes.Clone(key)
	if string(key) == "missing" {
		return nil, ErrNotFound
	}
	return []byte("hello"), nil
}

func (f *fakeStore) Scan(_ context.Context, opts ScanOptions) (Iterator, error) {
	f.scan = opts
	return &sliceIter{pairs: []Pair{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b")}}}, nil
}

func (f *fakeStore) Commit(_ context.Context, ops []Op) error {
	f.lastOps = append([]Op(nil), ops...)
	return &ConflictError{Index: 3, Exists: true, Current: []byte("cur")}
}

func (f *fakeStore) Close(context.Context) error { return nil }

type sliceIter struct{ pairs []Pair }

func (s *sliceIter) Next(_ context.Context, max int) ([]Pair, error) {
	n := min(max, len(s.pairs))
	b := s.pairs[:n]
	s.pairs = s.pairs[n:]
	return b, nil
}
func (s *sliceIter) Close() error { return nil }

// TestGoldenVectors feeds the abi module's golden request vectors through
// the SDK's dispatcher and checks the responses against the golden response
// vectors, so the SDK and the spec cannot drift apart.
func TestGoldenVectors(t *testing.T) {
	vec := goldenVectors(t)
	f := &fakeStore{}
	d := newDispatcher(f)
	resp := d.dispatch(abi.OpInit, vec["init-request"])
	if st, _, _ := abi.SplitResponse(resp); st != abi.StatusOK || string(f.config) != "dsn=x" {
		t.Fatalf("INIT: status %v, config %q", st, f.config)
	}
	if resp := d.dispatch(abi.OpGet, vec["get-request"]); !bytes.Equal(resp, vec["get-response-ok"]) || string(f.lastKey) != "a\x00\xff" {
		t.Errorf("GET: response %x (want %x), key %q", resp, vec["get-response-ok"], f.lastKey)
	}
	if resp := d.dispatch(abi.OpCommit, vec["commit-request"]); !bytes.Equal(resp, vec["commit-response-conflict"]) {
		t.Errorf("COMMIT: response %x, want %x", resp, vec["commit-response-conflict"])
	}
	if len(f.lastOps) != 5 || f.lastOps[3].Kind != OpCompareAndSwap || string(f.lastOps[3].Expected) != "o" || string(f.lastOps[3].Value) != "n" {
		t.Errorf("COMMIT decoded %+v", f.lastOps)
	}
	// SCAN_OPEN with batch_size 128 gets both pairs and learns that the
	// scan is over, so more is false (the vector has more=true for a
	// longer scan): check the decoded options and pairs instead.
	resp = d.dispatch(abi.OpScanOpen, vec["scan-open-request"])
	st, body, err := abi.SplitResponse(resp)
	if err != nil || st != abi.StatusOK {
		t.Fatalf("SCAN_OPEN: %v %v", st, err)
	}
	_, pairs, more, err := abi.DecodeScanOpened(body, nil)
	if err != nil || len(pairs) != 2 || more || !f.scan.Reverse || string(f.scan.Start) != "a" || f.scan.Limit != 300 {
		t.Errorf("SCAN_OPEN: %d pairs, more=%v, err=%v, opts %+v", len(pairs), more, err, f.scan)
	}
	if resp := d.dispatch(abi.OpScanClose, vec["scan-close-request"]); !bytes.Equal(resp, abi.AppendOK(nil)) {
		t.Errorf("SCAN_CLOSE of an unknown id: %x, want OK", resp)
	}
	if resp := d.dispatch(abi.OpPartitions, vec["partitions-request"]); resp[0] != byte(abi.StatusUnsupported) {
		t.Errorf("PARTITIONS without a Partitioner: %x, want UNSUPPORTED", resp)
	}
	if resp := d.dispatch(abi.Op(200), vec["close-request"]); resp[0] != byte(abi.StatusUnsupported) {
		t.Errorf("unknown op: %x, want UNSUPPORTED", resp)
	}
	if resp := d.dispatch(abi.OpGet, []byte{0x80}); resp[0] != byte(abi.StatusInvalid) {
		t.Errorf("malformed GET: %x, want INVALID", resp)
	}
	if resp := d.dispatch(abi.OpClose, vec["close-request"]); !bytes.Equal(resp, abi.AppendOK(nil)) {
		t.Errorf("CLOSE: %x", resp)
	}
}

// goldenVectors reads the abi module's golden vectors by name.
func goldenVectors(t *testing.T) map[string][]byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "abi", abi.VectorsPath))
	if err != nil {
		t.Fatal(err)
	}
	var vs []abi.Vector
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	vec := map[string][]byte{}
	for _, v := range vs {
		b, err := hex.DecodeString(v.Hex)
		if err != nil {
			t.Fatal(err)
		}
		vec[v.Name] = b
	}
	return vec
}
