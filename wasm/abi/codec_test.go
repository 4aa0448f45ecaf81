package abi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

func TestUvarintMatchesEncodingBinary(t *testing.T) {
	for _, v := range []uint64{0, 1, 127, 128, 255, 300, 1 << 32, math.MaxInt64, math.MaxUint64} {
		got := AppendUvarint(nil, v)
		if want := binary.AppendUvarint(nil, v); !bytes.Equal(got, want) {
			t.Errorf("AppendUvarint(%d) = %x, want %x", v, got, want)
		}
		if UvarintLen(v) != len(got) {
			t.Errorf("UvarintLen(%d) = %d, want %d", v, UvarintLen(v), len(got))
		}
		r := NewReader(got)
		if back := r.Uvarint(); back != v || r.Finish() != nil {
			t.Errorf("Uvarint(%x) = %d, %v", got, back, r.Finish())
		}
	}
}

func TestReaderRejectsMalformed(t *testing.T) {
	cases := []struct {
		name string
		in   []byte
		read func(r *Reader)
		want error
	}{
		{"empty varint", nil, func(r *Reader) { r.Uvarint() }, ErrShort},
		{"unterminated varint", []byte{0x80, 0x80}, func(r *Reader) { r.Uvarint() }, ErrShort},
		{"11-byte varint", bytes.Repeat([]byte{0x80}, 11), func(r *Reader) { r.Uvarint() }, ErrOverflow},
		{"65-bit varint", append(bytes.Repeat([]byte{0xff}, 9), 0x02), func(r *Reader) { r.Uvarint() }, ErrOverflow},
		{"non-shortest zero", []byte{0x80, 0x00}, func(r *Reader) { r.Uvarint() }, ErrNotShortest},
		{"non-shortest 1", []byte{0x81, 0x80, 0x00}, func(r *Reader) { r.Uvarint() }, ErrNotShortest},
		{"u32 overflow", AppendUvarint(nil, 1<<32), func(r *Reader) { r.Uint32() }, ErrOverflow},
		{"i64 overflow", AppendUvarint(nil, 1<<63), func(r *Reader) { r.Int64() }, ErrOverflow},
		{"bytes longer than input", []byte{5, 'a', 'b'}, func(r *Reader) { r.Bytes() }, ErrShort},
		{"huge bytes length", AppendUvarint(nil, math.MaxUint64), func(r *Reader) { r.Bytes() }, ErrShort},
		{"bool 2", []byte{2}, func(r *Reader) { r.Bool() }, ErrBadValue},
		{"count beyond input", []byte{100, 0, 0}, func(r *Reader) { r.Count(2) }, ErrCount},
	}
	for _, c := range cases {
		r := NewReader(c.in)
		c.read(&r)
		if !errors.Is(r.Err(), c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, r.Err(), c.want)
		}
	}
}

func TestFixedMessagesRejectTrailingBytes(t *testing.T) {
	b := (&GetRequest{Key: []byte("k")}).Append(nil)
	var m GetRequest
	if err := m.Decode(append(b, 0)); !errors.Is(err, ErrTrailing) {
		t.Errorf("GetRequest with a trailing byte: %v, want ErrTrailing", err)
	}
	// Extensible messages accept trailing fields of later minors.
	ib := (&InitRequest{Config: []byte("c")}).Append(nil)
	var im InitRequest
	if err := im.Decode(append(ib, 1, 2, 3)); err != nil || string(im.Config) != "c" {
		t.Errorf("InitRequest with trailing fields: %v, %q", err, im.Config)
	}
}

func TestCommitRejectsUnknownKindAndCountsBytes(t *testing.T) {
	good := (&CommitRequest{Ops: []CommitOp{{Kind: KindPut, Key: []byte("k"), Value: []byte("v")}}}).Append(nil)
	bad := bytes.Clone(good)
	bad[2] = 9 // the kind of the first op
	var m CommitRequest
	if err := m.Decode(bad); !errors.Is(err, ErrBadValue) {
		t.Errorf("unknown kind: %v, want ErrBadValue", err)
	}
	if err := m.Decode(good); err != nil || len(m.Ops) != 1 {
		t.Fatalf("good: %v, %d ops", err, len(m.Ops))
	}
	for _, op := range m.Ops {
		if n := CommitOpLen(op.Kind, op.Key, op.Value, op.Expected); n != len(AppendCommitOp(nil, op.Kind, op.Key, op.Value, op.Expected)) {
			t.Errorf("CommitOpLen = %d, wrong", n)
		}
	}
}

func TestBatchLen(t *testing.T) {
	pairs := []Pair{{Key: []byte("a"), Value: bytes.Repeat([]byte("v"), 200)}, {Key: []byte("b")}}
	if got, want := BatchLen(pairs), len(AppendBatch(nil, pairs, true)); got != want {
		t.Errorf("BatchLen = %d, want %d", got, want)
	}
}

// FuzzDecoders feeds arbitrary bytes to every decoder: none may panic, and
// none may return more elements than the input could encode.
func FuzzDecoders(f *testing.F) {
	for _, c := range golden() {
		f.Add(c.encode())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var (
			ir InitRequest
			m  Manifest
			g  GetRequest
			so ScanOpenRequest
			sn ScanNextRequest
			sc ScanCloseRequest
			cr CommitRequest
			pr PartitionsRequest
			er EmptyRequest
		)
		_ = ir.Decode(b)
		_ = m.Decode(b)
		_ = g.Decode(b)
		_ = so.Decode(b)
		_ = sn.Decode(b)
		_ = sc.Decode(b)
		if cr.Decode(b) == nil && len(cr.Ops) > len(b)/2 {
			t.Fatalf("%d ops from %d bytes", len(cr.Ops), len(b))
		}
		_ = pr.Decode(b)
		_ = er.Decode(b)
		_, _, _ = SplitResponse(b)
		_, _, _, _ = DecodeScanOpened(b, nil)
		_, _, _ = DecodeBatch(b, nil)
		_, _, _, _ = DecodeConflict(b)
		_, _ = DecodePartitions(b, nil)
		_, _ = DecodeValue(b)
		_, _ = DecodeMessage(b)
	})
}

// TestSizeBody: SIZE's byte count is an i64, so 2^63 is malformed, a body
// without it is short, one with more is trailing, and a negative size the
// engine computed is sent as 0 rather than as a field no decoder accepts.
func TestSizeBody(t *testing.T) {
	for _, c := range []struct {
		name string
		body []byte
		want error
	}{
		{"2^63-1", AppendUvarint(nil, math.MaxInt64), nil},
		{"2^63", AppendUvarint(nil, 1<<63), ErrOverflow},
		{"empty", nil, ErrShort},
		{"trailing", []byte{1, 0}, ErrTrailing},
	} {
		if _, err := DecodeSize(c.body); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	n, err := DecodeSize(AppendSize(nil, -5)[1:])
	if n != 0 || err != nil {
		t.Errorf("AppendSize(-5) decodes as %d, %v; want 0", n, err)
	}
}
