package sdk

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/engramkv/engram/wasm/abi"
)

// pairStore serves a fixed, ordered list of pairs, a few per Next call, so
// that a batch is assembled from several iterator calls.
type pairStore struct {
	fakeStore
	pairs   []Pair
	perNext int
}

func (s *pairStore) Scan(_ context.Context, opts ScanOptions) (Iterator, error) {
	var in []Pair
	for _, p := range s.pairs {
		if bytes.Compare(p.Key, opts.Start) >= 0 && (len(opts.End) == 0 || bytes.Compare(p.Key, opts.End) < 0) {
			in = append(in, p)
		}
	}
	return &chunkIter{pairs: in, per: s.perNext}, nil
}

type chunkIter struct {
	pairs []Pair
	per   int
}

func (c *chunkIter) Next(_ context.Context, max int) ([]Pair, error) {
	n := min(max, c.per, len(c.pairs))
	b := c.pairs[:n]
	c.pairs = c.pairs[n:]
	return b, nil
}
func (c *chunkIter) Close() error { return nil }

// TestScanBatches checks the scan responses byte for byte against the abi
// encoder, across batch sizes, limits and a response cap that splits
// batches, and that the pairs of all batches are the scan's pairs in order.
func TestScanBatches(t *testing.T) {
	var pairs []Pair
	for i := range 300 {
		pairs = append(pairs, Pair{Key: fmt.Appendf(nil, "k%04d", i), Value: bytes.Repeat([]byte{byte(i)}, i%37)})
	}
	for _, tc := range []struct {
		batch, limit, perNext, maxResp int
	}{
		{0, 0, 7, 0}, {1, 0, 1, 0}, {50, 0, 7, 0}, {50, 120, 13, 0}, {300, 0, 300, 0},
		{128, 0, 64, 400}, {10, 25, 3, 200}, {1000, 299, 1000, 0},
	} {
		t.Run(fmt.Sprintf("batch=%d,limit=%d,per=%d,max=%d", tc.batch, tc.limit, tc.perNext, tc.maxResp), func(t *testing.T) {
			d := newDispatcher(&pairStore{pairs: pairs, perNext: tc.perNext})
			if st, _, _ := abi.SplitResponse(d.dispatch(abi.OpInit, (&abi.InitRequest{MaxResponse: uint32(tc.maxResp)}).Append(nil))); st != abi.StatusOK {
				t.Fatalf("INIT: %v", st)
			}
			resp := d.dispatch(abi.OpScanOpen, (&abi.ScanOpenRequest{Start: []byte("k"), Limit: uint64(tc.limit), BatchSize: uint32(tc.batch)}).Append(nil))
			st, body, err := abi.SplitResponse(resp)
			if err != nil || st != abi.StatusOK {
				t.Fatalf("SCAN_OPEN: %v %v", st, err)
			}
			id, got, more, err := abi.DecodeScanOpened(body, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want := abi.AppendScanOpened(nil, id, got, more); !bytes.Equal(resp, want) {
				t.Fatalf("SCAN_OPEN response %x, the abi encodes %x", resp, want)
			}
			all := clonePairs(got)
			for more {
				resp := d.dispatch(abi.OpScanNext, (&abi.ScanNextRequest{ID: id, BatchSize: uint32(tc.batch)}).Append(nil))
				st, body, err := abi.SplitResponse(resp)
				if err != nil || st != abi.StatusOK {
					t.Fatalf("SCAN_NEXT: %v %v %q", st, err, body)
				}
				var batch []Pair
				batch, more, err = abi.DecodeBatch(body, nil)
				if err != nil {
					t.Fatal(err)
				}
				if want := abi.AppendBatch(abi.AppendStatus(nil, abi.StatusOK), batch, more); !bytes.Equal(resp, want) {
					t.Fatalf("SCAN_NEXT response %x, the abi encodes %x", resp, want)
				}
				if tc.maxResp > 0 && len(resp) > tc.maxResp {
					t.Fatalf("response of %d bytes over the %d-byte cap", len(resp), tc.maxResp)
				}
				if want := tc.batch; want > 0 && len(batch) > want {
					t.Fatalf("batch of %d pairs, asked for %d", len(batch), want)
				}
				all = append(all, clonePairs(batch)...)
			}
			want := pairs
			if tc.limit > 0 {
				want = pairs[:tc.limit]
			}
			if len(all) != len(want) {
				t.Fatalf("%d pairs, want %d", len(all), len(want))
			}
			for i := range want {
				if !bytes.Equal(all[i].Key, want[i].Key) || !bytes.Equal(all[i].Value, want[i].Value) {
					t.Fatalf("pair %d: %q=%x, want %q=%x", i, all[i].Key, all[i].Value, want[i].Key, want[i].Value)
				}
			}
			if len(d.scans) != 0 {
				t.Fatalf("%d scans still held after the last batch", len(d.scans))
			}
		})
	}
}

func clonePairs(ps []Pair) []Pair {
	out := make([]Pair, len(ps))
	for i, p := range ps {
		out[i] = Pair{Key: bytes.Clone(p.Key), Value: bytes.Clone(p.Value)}
	}
	return out
}

// TestDuplicateKeys checks that a batch naming a key twice is refused with
// the index of the second occurrence, whatever its size, and that batches
// of distinct keys (including keys that differ only in their last byte or
// their length) pass.
func TestDuplicateKeys(t *testing.T) {
	d := newDispatcher(&fakeStore{})
	for _, n := range []int{2, 3, 16, 17, 100, 1000} {
		ops := make([]Op, n)
		for i := range ops {
			ops[i] = Op{Kind: OpDelete, Key: fmt.Appendf(nil, "/registry/leases/kube-node-lease/node-%d", i)}
		}
		if msg := d.checkBatch(ops); msg != "" {
			t.Fatalf("%d distinct keys refused: %s", n, msg)
		}
		prefixes := []Op{{Kind: OpDelete, Key: []byte("abcdefgh")}, {Kind: OpDelete, Key: []byte("abcdefghi")}, {Kind: OpDelete, Key: []byte("abcdefg")}}
		if msg := d.checkBatch(append(prefixes, ops...)); msg != "" {
			t.Fatalf("keys that are prefixes of each other refused: %s", msg)
		}
		for _, pos := range [][2]int{{0, 1}, {0, n - 1}, {n / 2, n - 1}, {n - 2, n - 1}} {
			if pos[0] == pos[1] {
				continue
			}
			dup := append([]Op(nil), ops...)
			dup[pos[1]].Key = bytes.Clone(dup[pos[0]].Key)
			want := fmt.Sprintf("op %d: key", pos[1])
			if msg := d.checkBatch(dup); !strings.HasPrefix(msg, want) {
				t.Fatalf("%d ops, op %d repeating op %d: %q, want %q...", n, pos[1], pos[0], msg, want)
			}
		}
	}
}

// BenchmarkCheckBatch measures the duplicate check of a 16-op batch of
// same-length keys (natively here; the same code runs in the plugin).
func BenchmarkCheckBatch(b *testing.B) {
	d := newDispatcher(&fakeStore{})
	ops := make([]Op, 16)
	for i := range ops {
		ops[i] = Op{Kind: OpPut, Key: fmt.Appendf(nil, "/registry/leases/l-%02d", i)}
	}
	b.ReportAllocs()
	for b.Loop() {
		if msg := d.checkBatch(ops); msg != "" {
			b.Fatal(msg)
		}
	}
}
