//! The message layouts of ABI.md sections 4.1 and 4.2: every request and
//! every response, with an encoder and a decoder each.
//!
//! This module owns layouts only; what a message means is the dispatcher's
//! business ([`crate::dispatch`]). Decoders borrow their input (keys, values
//! and messages are `&'a [u8]` into the request buffer) and allocate only
//! the element vectors of COMMIT, scan batches and partitions, which
//! [`CommitRequest::decode_into`] lets a caller reuse. Like the codec they
//! never panic. The INIT request and the manifest are *extensible*: their
//! decoders ignore bytes after the fields they know. Every other message is
//! *fixed-layout* and trailing bytes are an error, which catches a wrong
//! length early.

use crate::abi::{Model, OpKind, Opcode, Status, HOST_FLAG_NET, SCAN_REVERSE};
use crate::codec::{put_bool, put_bytes, put_uvarint, DecodeError, Reader};

/// The header every request body starts with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// The request's deadline in nanoseconds since the Unix epoch (the
    /// host's wall clock), or 0 for none.
    pub deadline: i64,
}

impl Header {
    fn decode(r: &mut Reader<'_>) -> Result<Header, DecodeError> {
        Ok(Header { deadline: r.int64()? })
    }

    fn encode(&self, out: &mut Vec<u8>) {
        put_uvarint(out, self.deadline as u64);
    }
}

/// The body of INIT: the handshake that configures a fresh instance.
/// Extensible: later minors may append fields, which this decoder ignores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InitRequest<'a> {
    /// The request header.
    pub header: Header,
    /// The operator's plugin configuration, verbatim.
    pub config: &'a [u8],
    /// Host flag bits ([`HOST_FLAG_NET`]); unknown bits are ignored.
    pub host_flags: u64,
    /// This instance's index in the host's pool (0 for a single instance).
    pub instance: u32,
    /// The largest response, in bytes, the host accepts.
    pub max_response: u32,
}

impl<'a> InitRequest<'a> {
    /// Decodes an INIT body, ignoring fields of later minors.
    pub fn decode(b: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(b);
        Ok(InitRequest {
            header: Header::decode(&mut r)?,
            config: r.bytes()?,
            host_flags: r.uvarint()?,
            instance: r.uint32()?,
            max_response: r.uint32()?,
        })
    }

    /// Appends the encoded body to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.header.encode(out);
        put_bytes(out, self.config);
        put_uvarint(out, self.host_flags);
        put_uvarint(out, u64::from(self.instance));
        put_uvarint(out, u64::from(self.max_response));
    }

    /// Whether the operator allowed at least one network address.
    pub fn net_allowed(&self) -> bool {
        self.host_flags & HOST_FLAG_NET != 0
    }
}

/// The body of GET.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GetRequest<'a> {
    /// The request header.
    pub header: Header,
    /// The key to read.
    pub key: &'a [u8],
}

impl<'a> GetRequest<'a> {
    /// Decodes a GET body.
    pub fn decode(b: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(b);
        let m = GetRequest { header: Header::decode(&mut r)?, key: r.bytes()? };
        r.finish()?;
        Ok(m)
    }

    /// Appends the encoded body to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.header.encode(out);
        put_bytes(out, self.key);
    }
}

/// The body of SCAN_OPEN.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanOpenRequest<'a> {
    /// The request header.
    pub header: Header,
    /// Inclusive lower bound; empty means the first key.
    pub start: &'a [u8],
    /// Exclusive upper bound; empty means unbounded.
    pub end: &'a [u8],
    /// Descending order, from the last key below `end`.
    pub reverse: bool,
    /// Cap on the pairs of the whole scan; 0 means none.
    pub limit: u64,
    /// Cap on the pairs of the first batch; 0 lets the plugin choose.
    pub batch_size: u32,
}

impl<'a> ScanOpenRequest<'a> {
    /// Decodes a SCAN_OPEN body; reserved flag bits are [`DecodeError::BadValue`].
    pub fn decode(b: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(b);
        let header = Header::decode(&mut r)?;
        let start = r.bytes()?;
        let end = r.bytes()?;
        let flags = r.byte()?;
        let m = ScanOpenRequest {
            header,
            start,
            end,
            reverse: flags & SCAN_REVERSE != 0,
            limit: r.uvarint()?,
            batch_size: r.uint32()?,
        };
        r.finish()?;
        if flags & !SCAN_REVERSE != 0 {
            return Err(DecodeError::BadValue);
        }
        Ok(m)
    }

    /// Appends the encoded body to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.header.encode(out);
        put_bytes(out, self.start);
        put_bytes(out, self.end);
        out.push(if self.reverse { SCAN_REVERSE } else { 0 });
        put_uvarint(out, self.limit);
        put_uvarint(out, u64::from(self.batch_size));
    }
}

/// The body of SCAN_NEXT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanNextRequest {
    /// The request header.
    pub header: Header,
    /// The id SCAN_OPEN returned.
    pub id: u64,
    /// Cap on the pairs of this batch; 0 lets the plugin choose.
    pub batch_size: u32,
}

impl ScanNextRequest {
    /// Decodes a SCAN_NEXT body.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(b);
        let m = ScanNextRequest { header: Header::decode(&mut r)?, id: r.uvarint()?, batch_size: r.uint32()? };
        r.finish()?;
        Ok(m)
    }

    /// Appends the encoded body to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.header.encode(out);
        put_uvarint(out, self.id);
        put_uvarint(out, u64::from(self.batch_size));
    }
}

/// The body of SCAN_CLOSE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanCloseRequest {
    /// The request header.
    pub header: Header,
    /// The scan to release; unknown ids are fine.
    pub id: u64,
}

impl ScanCloseRequest {
    /// Decodes a SCAN_CLOSE body.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(b);
        let m = ScanCloseRequest { header: Header::decode(&mut r)?, id: r.uvarint()? };
        r.finish()?;
        Ok(m)
    }

    /// Appends the encoded body to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.header.encode(out);
        put_uvarint(out, self.id);
    }
}

/// One write of a COMMIT. The slices borrow the request buffer: they are
/// valid for the call only, so a store copies what it keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op<'a> {
    /// What to do.
    pub kind: OpKind,
    /// The key; never empty in a batch the dispatcher hands to a store.
    pub key: &'a [u8],
    /// The new value of PUT, PUT_IF_ABSENT and COMPARE_AND_SWAP (empty for
    /// the other kinds).
    pub value: &'a [u8],
    /// The value COMPARE_AND_SWAP and COMPARE_AND_DELETE require (empty for
    /// the other kinds). Empty and absent values are equal, but an absent
    /// key never matches.
    pub expected: &'a [u8],
}

impl<'a> Op<'a> {
    /// Appends the encoded op to `out`; fields its kind does not carry are
    /// not encoded.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.kind.code());
        put_bytes(out, self.key);
        if self.kind.has_expected() {
            put_bytes(out, self.expected);
        }
        if self.kind.has_value() {
            put_bytes(out, self.value);
        }
    }

    fn decode(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
        let kind = OpKind::from_code(r.byte()?).ok_or(DecodeError::BadValue)?;
        let key = r.bytes()?;
        let expected = if kind.has_expected() { r.bytes()? } else { &[] };
        let value = if kind.has_value() { r.bytes()? } else { &[] };
        Ok(Op { kind, key, value, expected })
    }
}

/// The body of COMMIT.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitRequest<'a> {
    /// The request header.
    pub header: Header,
    /// The writes, to apply all or none.
    pub ops: Vec<Op<'a>>,
}

/// The smallest encoded op: a DELETE of an empty key (kind, length 0).
const MIN_OP_SIZE: usize = 2;

impl<'a> CommitRequest<'a> {
    /// Decodes a COMMIT body into a new vector.
    pub fn decode(b: &'a [u8]) -> Result<Self, DecodeError> {
        let mut ops = Vec::new();
        let header = Self::decode_into(b, &mut ops)?;
        Ok(CommitRequest { header, ops })
    }

    /// Decodes a COMMIT body, replacing the contents of `ops` (whose
    /// capacity is reused). Unknown kinds are [`DecodeError::BadValue`];
    /// the structural rules (non-empty keys, no key twice) are the
    /// dispatcher's to check, so that it can answer with a precise message.
    pub fn decode_into(b: &'a [u8], ops: &mut Vec<Op<'a>>) -> Result<Header, DecodeError> {
        ops.clear();
        let mut r = Reader::new(b);
        let header = Header::decode(&mut r)?;
        let n = r.count(MIN_OP_SIZE)?;
        // count() bounded n by the message size, so this reserve is too.
        ops.reserve(n);
        for _ in 0..n {
            ops.push(Op::decode(&mut r)?);
        }
        r.finish()?;
        Ok(header)
    }

    /// Appends the encoded body to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.header.encode(out);
        put_uvarint(out, self.ops.len() as u64);
        for op in &self.ops {
            op.encode(out);
        }
    }
}

/// The body of PARTITIONS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionsRequest<'a> {
    /// The request header.
    pub header: Header,
    /// Inclusive start of the range to split.
    pub start: &'a [u8],
    /// Exclusive end; empty means unbounded.
    pub end: &'a [u8],
    /// Cap on the number of ranges; 0 lets the plugin choose.
    pub max_parts: u32,
}

impl<'a> PartitionsRequest<'a> {
    /// Decodes a PARTITIONS body.
    pub fn decode(b: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(b);
        let m = PartitionsRequest {
            header: Header::decode(&mut r)?,
            start: r.bytes()?,
            end: r.bytes()?,
            max_parts: r.uint32()?,
        };
        r.finish()?;
        Ok(m)
    }

    /// Appends the encoded body to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.header.encode(out);
        put_bytes(out, self.start);
        put_bytes(out, self.end);
        put_uvarint(out, u64::from(self.max_parts));
    }
}

/// The body of CLOSE, IDLE, SIZE and RECLAIM: the header alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmptyRequest {
    /// The request header.
    pub header: Header,
}

impl EmptyRequest {
    /// Decodes a header-only body.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(b);
        let m = EmptyRequest { header: Header::decode(&mut r)? };
        r.finish()?;
        Ok(m)
    }

    /// Appends the encoded body to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.header.encode(out);
    }
}

/// Decodes the header of any request, for an op whose body is not decoded
/// (an unknown op answered UNSUPPORTED).
pub fn decode_header(b: &[u8]) -> Result<Header, DecodeError> {
    Header::decode(&mut Reader::new(b))
}

/// Any request, decoded according to its op code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// INIT.
    Init(InitRequest<'a>),
    /// GET.
    Get(GetRequest<'a>),
    /// SCAN_OPEN.
    ScanOpen(ScanOpenRequest<'a>),
    /// SCAN_NEXT.
    ScanNext(ScanNextRequest),
    /// SCAN_CLOSE.
    ScanClose(ScanCloseRequest),
    /// COMMIT.
    Commit(CommitRequest<'a>),
    /// PARTITIONS.
    Partitions(PartitionsRequest<'a>),
    /// CLOSE.
    Close(EmptyRequest),
    /// IDLE.
    Idle(EmptyRequest),
    /// SIZE (ABI 1.1).
    Size(EmptyRequest),
    /// RECLAIM (ABI 1.1).
    Reclaim(EmptyRequest),
}

impl<'a> Request<'a> {
    /// Decodes the body of a request of op `op`.
    pub fn decode(op: Opcode, b: &'a [u8]) -> Result<Self, DecodeError> {
        Ok(match op {
            Opcode::Init => Request::Init(InitRequest::decode(b)?),
            Opcode::Get => Request::Get(GetRequest::decode(b)?),
            Opcode::ScanOpen => Request::ScanOpen(ScanOpenRequest::decode(b)?),
            Opcode::ScanNext => Request::ScanNext(ScanNextRequest::decode(b)?),
            Opcode::ScanClose => Request::ScanClose(ScanCloseRequest::decode(b)?),
            Opcode::Commit => Request::Commit(CommitRequest::decode(b)?),
            Opcode::Partitions => Request::Partitions(PartitionsRequest::decode(b)?),
            Opcode::Close => Request::Close(EmptyRequest::decode(b)?),
            Opcode::Idle => Request::Idle(EmptyRequest::decode(b)?),
            Opcode::Size => Request::Size(EmptyRequest::decode(b)?),
            Opcode::Reclaim => Request::Reclaim(EmptyRequest::decode(b)?),
        })
    }

    /// The request's op code.
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Init(_) => Opcode::Init,
            Request::Get(_) => Opcode::Get,
            Request::ScanOpen(_) => Opcode::ScanOpen,
            Request::ScanNext(_) => Opcode::ScanNext,
            Request::ScanClose(_) => Opcode::ScanClose,
            Request::Commit(_) => Opcode::Commit,
            Request::Partitions(_) => Opcode::Partitions,
            Request::Close(_) => Opcode::Close,
            Request::Idle(_) => Opcode::Idle,
            Request::Size(_) => Opcode::Size,
            Request::Reclaim(_) => Opcode::Reclaim,
        }
    }

    /// Appends the encoded body to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Request::Init(m) => m.encode(out),
            Request::Get(m) => m.encode(out),
            Request::ScanOpen(m) => m.encode(out),
            Request::ScanNext(m) => m.encode(out),
            Request::ScanClose(m) => m.encode(out),
            Request::Commit(m) => m.encode(out),
            Request::Partitions(m) => m.encode(out),
            Request::Close(m) | Request::Idle(m) | Request::Size(m) | Request::Reclaim(m) => m.encode(out),
        }
    }
}

/// The manifest as it travels: the OK body of INIT (ABI.md section 5).
/// Extensible: later minors may append fields. The decoder checks the
/// encoding only (a host validates the values), so `model` stays raw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireManifest<'a> {
    /// The engine's name; a host requires it non-empty.
    pub name: &'a [u8],
    /// The plugin's version, free-form.
    pub version: &'a [u8],
    /// The ABI minor the plugin was written against.
    pub abi_minor: u32,
    /// The instance model's code ([`Model::code`]).
    pub model: u8,
    /// Cap on the pool (0: none).
    pub max_instances: u32,
    /// Bit [`Opcode::bit`] set for every op handled.
    pub ops: u64,
    /// `FEATURE_*` bits.
    pub features: u64,
    /// Cap on the ops of one COMMIT (0: none).
    pub max_commit_ops: u32,
    /// Cap on the encoded size of one COMMIT body (0: none).
    pub max_commit_bytes: u32,
    /// Cap on the pairs of one scan batch (0: none).
    pub max_scan_batch: u32,
}

impl<'a> WireManifest<'a> {
    /// Decodes a manifest, ignoring fields of later minors.
    pub fn decode(b: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(b);
        Ok(WireManifest {
            name: r.bytes()?,
            version: r.bytes()?,
            abi_minor: r.uint32()?,
            model: r.byte()?,
            max_instances: r.uint32()?,
            ops: r.uvarint()?,
            features: r.uvarint()?,
            max_commit_ops: r.uint32()?,
            max_commit_bytes: r.uint32()?,
            max_scan_batch: r.uint32()?,
        })
    }

    /// Appends the encoded manifest (without a status byte) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_bytes(out, self.name);
        put_bytes(out, self.version);
        put_uvarint(out, u64::from(self.abi_minor));
        out.push(self.model);
        put_uvarint(out, u64::from(self.max_instances));
        put_uvarint(out, self.ops);
        put_uvarint(out, self.features);
        put_uvarint(out, u64::from(self.max_commit_ops));
        put_uvarint(out, u64::from(self.max_commit_bytes));
        put_uvarint(out, u64::from(self.max_scan_batch));
    }

    /// The instance model, if the code is a known one.
    pub fn model(&self) -> Option<Model> {
        Model::from_code(self.model)
    }
}

/// One key and value of a scan batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair<'a> {
    /// The key.
    pub key: &'a [u8],
    /// Its value.
    pub value: &'a [u8],
}

/// A half-open key range `[start, end)`; an empty `end` is unbounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range<'a> {
    /// Inclusive start.
    pub start: &'a [u8],
    /// Exclusive end; empty means unbounded.
    pub end: &'a [u8],
}

/// Any response, decoded according to the op it answers. Decoding refuses a
/// status the op does not allow (NOT_FOUND outside GET, CONFLICT and
/// UNCERTAIN outside COMMIT), as a host does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response<'a> {
    /// OK to INIT: the manifest.
    Manifest(WireManifest<'a>),
    /// OK to GET: the value.
    Value(&'a [u8]),
    /// OK to SCAN_OPEN: the scan id and the first batch.
    ScanOpened {
        /// The scan's id for SCAN_NEXT and SCAN_CLOSE.
        id: u64,
        /// The batch's pairs.
        pairs: Vec<Pair<'a>>,
        /// Whether SCAN_NEXT may yield more (false: the scan is released).
        more: bool,
    },
    /// OK to SCAN_NEXT: the next batch.
    Batch {
        /// The batch's pairs.
        pairs: Vec<Pair<'a>>,
        /// Whether SCAN_NEXT may yield more (false: the scan is released).
        more: bool,
    },
    /// OK to PARTITIONS: the ranges.
    Partitions(Vec<Range<'a>>),
    /// OK to SIZE: how many bytes the store's data takes (an i64 on the
    /// wire, so never above `i64::MAX`).
    Size(u64),
    /// OK with an empty body (SCAN_CLOSE, COMMIT, CLOSE, IDLE, RECLAIM).
    Ok,
    /// NOT_FOUND (GET only).
    NotFound,
    /// CONFLICT (COMMIT only).
    Conflict {
        /// The lowest failing op's index.
        index: u32,
        /// Whether its key exists.
        exists: bool,
        /// Its current value (empty when absent).
        current: &'a [u8],
    },
    /// Any status with a message body.
    Error {
        /// UNCERTAIN (COMMIT only), UNSUPPORTED, INVALID, UNAVAILABLE,
        /// DEADLINE or INTERNAL.
        status: Status,
        /// UTF-8 text, not checked.
        message: &'a [u8],
    },
}

impl<'a> Response<'a> {
    /// Decodes a whole response (status byte and body) to op `op`.
    pub fn decode(op: Opcode, b: &'a [u8]) -> Result<Self, DecodeError> {
        let (&code, body) = b.split_first().ok_or(DecodeError::Short)?;
        let status = Status::from_code(code).ok_or(DecodeError::BadValue)?;
        if !status.allowed_for(op) {
            return Err(DecodeError::BadValue);
        }
        let mut r = Reader::new(body);
        let resp = match status {
            Status::Ok => match op {
                // Extensible: no finish().
                Opcode::Init => return Ok(Response::Manifest(WireManifest::decode(body)?)),
                Opcode::Get => Response::Value(r.bytes()?),
                Opcode::ScanOpen => {
                    let id = r.uvarint()?;
                    let (pairs, more) = decode_batch(&mut r)?;
                    Response::ScanOpened { id, pairs, more }
                }
                Opcode::ScanNext => {
                    let (pairs, more) = decode_batch(&mut r)?;
                    Response::Batch { pairs, more }
                }
                Opcode::Partitions => {
                    let n = r.count(2)?;
                    let mut ranges = Vec::with_capacity(n);
                    for _ in 0..n {
                        ranges.push(Range { start: r.bytes()?, end: r.bytes()? });
                    }
                    Response::Partitions(ranges)
                }
                Opcode::Size => Response::Size(r.int64()? as u64),
                Opcode::ScanClose | Opcode::Commit | Opcode::Close | Opcode::Idle | Opcode::Reclaim => Response::Ok,
            },
            Status::NotFound => Response::NotFound,
            Status::Conflict => Response::Conflict { index: r.uint32()?, exists: r.bool()?, current: r.bytes()? },
            _ => Response::Error { status, message: r.bytes()? },
        };
        r.finish()?;
        Ok(resp)
    }

    /// Appends the encoded response, status byte first, to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Response::Manifest(m) => {
                out.push(Status::Ok.code());
                m.encode(out);
            }
            Response::Value(v) => {
                out.push(Status::Ok.code());
                put_bytes(out, v);
            }
            Response::ScanOpened { id, pairs, more } => {
                out.push(Status::Ok.code());
                put_uvarint(out, *id);
                encode_batch(out, pairs, *more);
            }
            Response::Batch { pairs, more } => {
                out.push(Status::Ok.code());
                encode_batch(out, pairs, *more);
            }
            Response::Partitions(ranges) => {
                out.push(Status::Ok.code());
                put_uvarint(out, ranges.len() as u64);
                for r in ranges {
                    put_bytes(out, r.start);
                    put_bytes(out, r.end);
                }
            }
            Response::Size(n) => {
                out.push(Status::Ok.code());
                put_uvarint(out, *n);
            }
            Response::Ok => out.push(Status::Ok.code()),
            Response::NotFound => out.push(Status::NotFound.code()),
            Response::Conflict { index, exists, current } => {
                out.push(Status::Conflict.code());
                put_uvarint(out, u64::from(*index));
                put_bool(out, *exists);
                put_bytes(out, current);
            }
            Response::Error { status, message } => {
                out.push(status.code());
                put_bytes(out, message);
            }
        }
    }
}

fn decode_batch<'a>(r: &mut Reader<'a>) -> Result<(Vec<Pair<'a>>, bool), DecodeError> {
    // The smallest pair is two empty strings: 2 bytes.
    let n = r.count(2)?;
    let mut pairs = Vec::with_capacity(n);
    for _ in 0..n {
        pairs.push(Pair { key: r.bytes()?, value: r.bytes()? });
    }
    Ok((pairs, r.bool()?))
}

fn encode_batch(out: &mut Vec<u8>, pairs: &[Pair<'_>], more: bool) {
    put_uvarint(out, pairs.len() as u64);
    for p in pairs {
        put_bytes(out, p.key);
        put_bytes(out, p.value);
    }
    put_bool(out, more);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_rejects_unknown_kind_and_reuses_ops() {
        let req = CommitRequest {
            header: Header::default(),
            ops: vec![Op { kind: OpKind::Put, key: b"k", value: b"v", expected: b"" }],
        };
        let mut good = Vec::new();
        req.encode(&mut good);
        let mut bad = good.clone();
        bad[2] = 9; // the first op's kind
        assert_eq!(CommitRequest::decode(&bad), Err(DecodeError::BadValue));
        let mut ops = Vec::with_capacity(8);
        let cap = ops.capacity();
        assert_eq!(CommitRequest::decode_into(&good, &mut ops), Ok(Header::default()));
        assert_eq!(ops, req.ops);
        assert_eq!(ops.capacity(), cap);
    }

    #[test]
    fn scan_open_rejects_reserved_flags() {
        let m = ScanOpenRequest { start: b"a", reverse: true, ..Default::default() };
        let mut b = Vec::new();
        m.encode(&mut b);
        assert_eq!(ScanOpenRequest::decode(&b), Ok(m));
        b[4] |= 2; // deadline, start "a", end "", then flags
        assert_eq!(ScanOpenRequest::decode(&b), Err(DecodeError::BadValue));
    }

    #[test]
    fn size_is_an_i64_and_reclaim_has_no_body() {
        let max = [0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        assert_eq!(Response::decode(Opcode::Size, &max), Ok(Response::Size(i64::MAX as u64)));
        let over = [0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
        assert_eq!(Response::decode(Opcode::Size, &over), Err(DecodeError::Overflow));
        assert_eq!(Response::decode(Opcode::Size, &[0]), Err(DecodeError::Short));
        assert_eq!(Response::decode(Opcode::Size, &[1]), Err(DecodeError::BadValue), "NOT_FOUND");
        assert_eq!(Response::decode(Opcode::Reclaim, &[0]), Ok(Response::Ok));
        assert_eq!(Response::decode(Opcode::Reclaim, &[0, 0]), Err(DecodeError::Trailing));
        assert_eq!(Response::decode(Opcode::Reclaim, &[3, 0]), Err(DecodeError::BadValue), "UNCERTAIN");
        assert_eq!(Request::decode(Opcode::Size, &[0, 0]), Err(DecodeError::Trailing));
        assert_eq!(Request::decode(Opcode::Reclaim, &[0]), Ok(Request::Reclaim(EmptyRequest::default())));
    }

    #[test]
    fn responses_refuse_statuses_their_op_does_not_allow() {
        assert_eq!(Response::decode(Opcode::Commit, &[1]), Err(DecodeError::BadValue));
        assert_eq!(Response::decode(Opcode::Get, &[2, 0, 0, 0]), Err(DecodeError::BadValue));
        assert_eq!(Response::decode(Opcode::Get, &[3, 0]), Err(DecodeError::BadValue));
        assert_eq!(Response::decode(Opcode::Get, &[9, 0]), Err(DecodeError::BadValue));
        assert_eq!(Response::decode(Opcode::Get, &[]), Err(DecodeError::Short));
        assert_eq!(Response::decode(Opcode::Commit, &[0, 0]), Err(DecodeError::Trailing));
        assert_eq!(
            Response::decode(Opcode::Idle, &[5, 2, b'n', b'o']),
            Ok(Response::Error { status: Status::Invalid, message: b"no" })
        );
    }
}
