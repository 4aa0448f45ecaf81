package abi

import "errors"

// Decoding errors. They are sentinels, not formatted errors, so that a
// decoder rejecting garbage allocates nothing; callers wrap them with the op
// and the field they were decoding.
var (
	// ErrShort: the message ended inside a field.
	ErrShort = errors.New("abi: message truncated")
	// ErrOverflow: a uvarint is longer than 10 bytes or exceeds 64 bits,
	// or a value exceeds the range of its field.
	ErrOverflow = errors.New("abi: varint overflows its field")
	// ErrNotShortest: a uvarint has more bytes than its value needs (a
	// last byte of 0 after the first). ABI.md obliges encoders to emit the
	// shortest form; rejecting the others keeps one encoding per message,
	// which every SDK's decoder checks alike.
	ErrNotShortest = errors.New("abi: varint not in its shortest form")
	// ErrTrailing: bytes follow the last field of a fixed-layout message.
	ErrTrailing = errors.New("abi: trailing bytes after message")
	// ErrBadValue: a field holds a value outside its enumeration (an op
	// kind, a bool, reserved flag bits).
	ErrBadValue = errors.New("abi: field holds an invalid value")
	// ErrCount: an element count cannot fit in the remaining bytes.
	ErrCount = errors.New("abi: element count exceeds message size")
)

// AppendUvarint appends v as an unsigned LEB128 varint (Go's
// encoding/binary.AppendUvarint, restated to keep this module leaf-only).
func AppendUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// UvarintLen is the encoded size of v.
func UvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// AppendBytes appends p as a uvarint length followed by the bytes.
func AppendBytes(b, p []byte) []byte {
	b = AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

// AppendString is AppendBytes for a string.
func AppendString(b []byte, s string) []byte {
	b = AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// BytesLen is the encoded size of a byte string of n bytes.
func BytesLen(n int) int { return UvarintLen(uint64(n)) + n }

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// Reader decodes a message. Errors are sticky: after the first one every
// method returns a zero value and Err reports it, so a decoder can read all
// fields and check once. Byte strings alias the input.
type Reader struct {
	b   []byte
	off int
	err error
}

// NewReader returns a Reader over b.
func NewReader(b []byte) Reader { return Reader{b: b} }

// Err returns the first decoding error.
func (r *Reader) Err() error { return r.err }

// Len returns the number of unread bytes.
func (r *Reader) Len() int { return len(r.b) - r.off }

func (r *Reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// Uvarint reads an unsigned LEB128 varint of at most 10 bytes.
func (r *Reader) Uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	var v uint64
	var s uint
	for i := 0; i < 10; i++ {
		if r.off >= len(r.b) {
			r.fail(ErrShort)
			return 0
		}
		c := r.b[r.off]
		r.off++
		if c < 0x80 {
			if i == 9 && c > 1 {
				r.fail(ErrOverflow)
				return 0
			}
			if c == 0 && i > 0 {
				r.fail(ErrNotShortest)
				return 0
			}
			return v | uint64(c)<<s
		}
		v |= uint64(c&0x7f) << s
		s += 7
	}
	r.fail(ErrOverflow)
	return 0
}

// Uint32 reads a uvarint that must fit in 32 bits.
func (r *Reader) Uint32() uint32 { return uint32(r.uvarintUpTo(1<<32 - 1)) }

// Int64 reads a uvarint that must fit in a non-negative int64.
func (r *Reader) Int64() int64 { return int64(r.uvarintUpTo(1<<63 - 1)) }

// uvarintUpTo reads a uvarint that must not exceed limit.
func (r *Reader) uvarintUpTo(limit uint64) uint64 {
	v := r.Uvarint()
	if v > limit {
		r.fail(ErrOverflow)
		return 0
	}
	return v
}

// Byte reads one byte.
func (r *Reader) Byte() byte {
	if r.err != nil {
		return 0
	}
	if r.off >= len(r.b) {
		r.fail(ErrShort)
		return 0
	}
	c := r.b[r.off]
	r.off++
	return c
}

// Bool reads a byte that must be 0 or 1.
func (r *Reader) Bool() bool {
	switch r.Byte() {
	case 0:
		return false
	case 1:
		return true
	}
	r.fail(ErrBadValue)
	return false
}

// Bytes reads a length-prefixed byte string, aliasing the input. The result
// is never longer than the remaining input, whatever the length says. An
// empty string decodes as a non-nil empty slice only if the input has
// capacity; callers treat nil and empty alike, as kv does.
func (r *Reader) Bytes() []byte {
	n := r.Uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)-r.off) {
		r.fail(ErrShort)
		return nil
	}
	p := r.b[r.off : r.off+int(n) : r.off+int(n)]
	r.off += int(n)
	return p
}

// String reads a length-prefixed string. It allocates; use it only outside
// hot paths (manifests, error messages).
func (r *Reader) String() string { return string(r.Bytes()) }

// Count reads an element count and checks that count elements of at least
// minSize bytes each can fit in the rest of the message, so that garbage can
// never make a decoder allocate a huge slice.
func (r *Reader) Count(minSize int) int {
	n := r.Uvarint()
	if r.err != nil {
		return 0
	}
	if minSize < 1 {
		minSize = 1
	}
	if n > uint64(r.Len()/minSize) {
		r.fail(ErrCount)
		return 0
	}
	return int(n)
}

// Finish reports the first error, or ErrTrailing if unread bytes remain.
func (r *Reader) Finish() error {
	if r.err != nil {
		return r.err
	}
	if r.off != len(r.b) {
		return ErrTrailing
	}
	return nil
}
