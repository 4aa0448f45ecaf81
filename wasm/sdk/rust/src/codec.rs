//! The primitives of the ABI's encoding (ABI.md section 4): unsigned LEB128
//! varints, bools, length-prefixed byte strings and element counts.
//!
//! This module owns the byte-level rules and nothing else: message layouts
//! live in [`crate::messages`]. It must never panic and never allocate on
//! malformed input, whatever the bytes: a request is untrusted data to the
//! plugin (and a response is untrusted data to a host), and a panic in a
//! plugin traps the instance. Decoded byte strings borrow the input.
//!
//! The decoder is as strict as the Go one in `wasm/abi/codec.go` (a varint of more
//! than 10 bytes or 64 bits, a value too large for its field, a string or a
//! count running past the end, a bool other than 0 or 1), and one notch
//! stricter: it also refuses a varint that is not in its shortest form.
//! ABI.md requires encoders to emit the shortest form and every Engram
//! encoder does, so an over-long varint can only be corruption.

use std::fmt;

/// Why a message failed to decode. The variants are the Go codec's
/// sentinels (plus [`DecodeError::NonMinimal`]); they carry no data so that
/// rejecting garbage costs nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The message ended inside a field.
    Short,
    /// A varint is longer than 10 bytes or exceeds 64 bits, or a value
    /// exceeds the range of its field (`u32`, `i64`).
    Overflow,
    /// A varint is not in its shortest form (a trailing `0x80 .. 0x00`).
    NonMinimal,
    /// Bytes follow the last field of a fixed-layout message.
    Trailing,
    /// A field holds a value outside its enumeration: a bool other than 0
    /// or 1, an unknown op kind or status, reserved flag bits.
    BadValue,
    /// An element count cannot fit in the bytes that remain.
    Count,
}

impl DecodeError {
    /// A short description, without allocation.
    pub fn as_str(self) -> &'static str {
        match self {
            DecodeError::Short => "message truncated",
            DecodeError::Overflow => "varint overflows its field",
            DecodeError::NonMinimal => "varint not in its shortest form",
            DecodeError::Trailing => "trailing bytes after message",
            DecodeError::BadValue => "field holds an invalid value",
            DecodeError::Count => "element count exceeds message size",
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for DecodeError {}

/// Appends `v` as an unsigned LEB128 varint in its shortest form (Go's
/// `binary.AppendUvarint`).
#[inline]
pub fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The encoded size of `v`.
#[inline]
pub fn uvarint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// Appends `p` as a `bytes` field: its length as a varint, then the bytes.
#[inline]
pub fn put_bytes(out: &mut Vec<u8>, p: &[u8]) {
    put_uvarint(out, p.len() as u64);
    out.extend_from_slice(p);
}

/// The encoded size of a `bytes` field of `n` bytes.
#[inline]
pub fn bytes_len(n: usize) -> usize {
    uvarint_len(n as u64) + n
}

/// Appends a `bool` field.
#[inline]
pub fn put_bool(out: &mut Vec<u8>, v: bool) {
    out.push(v as u8);
}

/// A cursor over one message. Every method either consumes a whole field
/// and returns it, or returns an error; byte strings borrow the input for
/// `'a`, so decoding allocates nothing.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `b`.
    #[inline]
    pub fn new(b: &'a [u8]) -> Self {
        Reader { rest: b }
    }

    /// The number of unread bytes.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// Reads an unsigned LEB128 varint of at most 10 bytes and 64 bits, in
    /// its shortest form.
    #[inline]
    pub fn uvarint(&mut self) -> Result<u64, DecodeError> {
        // The one-byte case is most fields (lengths, small counts, a zero
        // deadline): keep it out of the loop.
        match self.rest.first() {
            None => return Err(DecodeError::Short),
            Some(&c) if c < 0x80 => {
                self.rest = &self.rest[1..];
                return Ok(u64::from(c));
            }
            Some(_) => {}
        }
        let mut v: u64 = 0;
        for (i, &c) in self.rest.iter().enumerate().take(10) {
            v |= u64::from(c & 0x7f) << (7 * i);
            if c < 0x80 {
                if i == 9 && c > 1 {
                    return Err(DecodeError::Overflow);
                }
                if c == 0 {
                    // A last group of zero adds nothing: the encoder should
                    // have stopped one byte earlier.
                    return Err(DecodeError::NonMinimal);
                }
                self.rest = &self.rest[i + 1..];
                return Ok(v);
            }
        }
        if self.rest.len() < 10 {
            Err(DecodeError::Short)
        } else {
            Err(DecodeError::Overflow)
        }
    }

    /// Reads a varint that must be below 2^32 (fields noted `u32`).
    #[inline]
    pub fn uint32(&mut self) -> Result<u32, DecodeError> {
        let v = self.uvarint()?;
        u32::try_from(v).map_err(|_| DecodeError::Overflow)
    }

    /// Reads a varint that must be below 2^63 (fields noted `i64`).
    #[inline]
    pub fn int64(&mut self) -> Result<i64, DecodeError> {
        let v = self.uvarint()?;
        i64::try_from(v).map_err(|_| DecodeError::Overflow)
    }

    /// Reads one byte.
    #[inline]
    pub fn byte(&mut self) -> Result<u8, DecodeError> {
        match self.rest.split_first() {
            Some((&c, rest)) => {
                self.rest = rest;
                Ok(c)
            }
            None => Err(DecodeError::Short),
        }
    }

    /// Reads a bool: a byte that must be 0 or 1.
    #[inline]
    pub fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::BadValue),
        }
    }

    /// Reads a `bytes` field, borrowing the input. The result is never
    /// longer than the input that remains, whatever the length says.
    #[inline]
    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.uvarint()?;
        if n > self.rest.len() as u64 {
            return Err(DecodeError::Short);
        }
        let (p, rest) = self.rest.split_at(n as usize);
        self.rest = rest;
        Ok(p)
    }

    /// Reads an element count and checks that that many elements of at
    /// least `min_size` bytes each fit in the rest of the message, so that
    /// garbage can never make a decoder reserve more than the message size.
    #[inline]
    pub fn count(&mut self, min_size: usize) -> Result<usize, DecodeError> {
        let n = self.uvarint()?;
        let fit = self.rest.len() / min_size.max(1);
        if n > fit as u64 {
            return Err(DecodeError::Count);
        }
        Ok(n as usize)
    }

    /// Succeeds if every byte was read: the end of a fixed-layout message.
    #[inline]
    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Trailing)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(v: u64) -> Vec<u8> {
        let mut b = Vec::new();
        put_uvarint(&mut b, v);
        b
    }

    #[test]
    fn uvarint_round_trips_and_matches_go() {
        // Expected bytes from Go's binary.AppendUvarint.
        let cases: &[(u64, &[u8])] = &[
            (0, &[0x00]),
            (1, &[0x01]),
            (127, &[0x7f]),
            (128, &[0x80, 0x01]),
            (300, &[0xac, 0x02]),
            (1 << 32, &[0x80, 0x80, 0x80, 0x80, 0x10]),
            (i64::MAX as u64, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]),
            (u64::MAX, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
        ];
        for &(v, want) in cases {
            assert_eq!(enc(v), want, "encoding {v}");
            assert_eq!(uvarint_len(v), want.len(), "length of {v}");
            let mut r = Reader::new(want);
            assert_eq!(r.uvarint(), Ok(v));
            assert_eq!(r.finish(), Ok(()));
        }
    }

    #[test]
    fn reader_rejects_malformed() {
        let mut r = Reader::new(&[]);
        assert_eq!(r.uvarint(), Err(DecodeError::Short));
        assert_eq!(Reader::new(&[0x80, 0x80]).uvarint(), Err(DecodeError::Short));
        assert_eq!(Reader::new(&[0x80; 11]).uvarint(), Err(DecodeError::Overflow));
        let mut b = vec![0xff; 9];
        b.push(0x02);
        assert_eq!(Reader::new(&b).uvarint(), Err(DecodeError::Overflow));
        assert_eq!(Reader::new(&[0x80, 0x00]).uvarint(), Err(DecodeError::NonMinimal));
        assert_eq!(Reader::new(&[0xff, 0x80, 0x00]).uvarint(), Err(DecodeError::NonMinimal));
        assert_eq!(Reader::new(&enc(1 << 32)).uint32(), Err(DecodeError::Overflow));
        assert_eq!(Reader::new(&enc(1 << 63)).int64(), Err(DecodeError::Overflow));
        assert_eq!(Reader::new(&[5, b'a', b'b']).bytes(), Err(DecodeError::Short));
        assert_eq!(Reader::new(&enc(u64::MAX)).bytes(), Err(DecodeError::Short));
        assert_eq!(Reader::new(&[2]).bool(), Err(DecodeError::BadValue));
        assert_eq!(Reader::new(&[100, 0, 0]).count(2), Err(DecodeError::Count));
        assert_eq!(Reader::new(&[1, 0, 0]).count(2), Ok(1));
        assert_eq!(Reader::new(&[2, 0, 0]).count(2), Err(DecodeError::Count));
        let mut r = Reader::new(&[1, 2]);
        assert_eq!(r.byte(), Ok(1));
        assert_eq!(r.finish(), Err(DecodeError::Trailing));
    }

    #[test]
    fn bytes_borrow_the_input() {
        let b = [3, b'a', b'b', b'c', 0];
        let mut r = Reader::new(&b);
        let s = r.bytes().unwrap();
        assert_eq!(s, b"abc");
        assert_eq!(s.as_ptr(), b[1..].as_ptr());
        assert_eq!(r.bytes(), Ok(&b""[..]));
        assert_eq!(r.finish(), Ok(()));
        assert_eq!(bytes_len(200), 202);
    }
}
