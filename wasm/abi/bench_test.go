package abi

import (
	"fmt"
	"testing"
)

// benchOps is the 64-op CAS batch (about 14.6 KB) of the measurements that
// chose this encoding, so numbers compare with them (DESIGN.md, "The ABI's
// guest-owned buffer").
func benchOps() []CommitOp {
	ops := make([]CommitOp, 64)
	for i := range ops {
		ops[i] = CommitOp{
			Kind:     KindCompareAndSwap,
			Key:      []byte(fmt.Sprintf("/registry/pods/default/pod-%04d", i)),
			Expected: make([]byte, 100),
			Value:    make([]byte, 100),
		}
	}
	return ops
}

func BenchmarkCommitEncodeDecode64(b *testing.B) {
	req := CommitRequest{Header: Header{Deadline: 1700000000000000000}, Ops: benchOps()}
	var buf []byte
	var dec CommitRequest
	b.ReportAllocs()
	for b.Loop() {
		buf = req.Append(buf[:0])
		if err := dec.Decode(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}

func BenchmarkScanBatchEncodeDecode100(b *testing.B) {
	pairs := make([]Pair, 100)
	for i := range pairs {
		pairs[i] = Pair{Key: []byte(fmt.Sprintf("/registry/pods/default/pod-%04d", i)), Value: make([]byte, 90)}
	}
	var buf []byte
	var dst []Pair
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendScanOpened(buf[:0], 1, pairs, true)
		_, body, _ := SplitResponse(buf)
		var err error
		_, dst, _, err = DecodeScanOpened(body, dst[:0])
		if err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}

func BenchmarkGetRoundTrip(b *testing.B) {
	key := []byte("/registry/pods/default/pod-0001")
	val := make([]byte, 512)
	var req, resp []byte
	b.ReportAllocs()
	for b.Loop() {
		req = (&GetRequest{Key: key}).Append(req[:0])
		var g GetRequest
		if err := g.Decode(req); err != nil {
			b.Fatal(err)
		}
		resp = AppendValue(resp[:0], val)
		_, body, _ := SplitResponse(resp)
		if _, err := DecodeValue(body); err != nil {
			b.Fatal(err)
		}
	}
}
