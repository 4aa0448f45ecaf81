//! The plugin side of `kvp_dispatch`, independent of wasm so that it runs
//! and is tested natively: decode a request, call the [`Store`], encode the
//! response into a buffer reused across calls.
//!
//! This module owns the semantics the SDK guarantees to a store and to the
//! host (the Go SDK's `wasm/sdk/dispatch.go` is its twin): INIT first and once,
//! nothing after CLOSE, malformed requests answered INVALID, empty keys and
//! keys named twice in a COMMIT refused before the store sees them, empty
//! scan ranges answered without the store, scan limits and batch sizes
//! enforced, batches split to stay under the host's `max_response`, scans
//! tracked by id and released exactly once, store errors mapped to the
//! statuses each op allows, and every response checked against
//! `max_response`. It must never panic whatever the request: a panic traps
//! the instance. It owns no memory of the host's (the runtime module hands
//! it the request as a slice).

use std::collections::BTreeMap;

use crate::abi::{Model, Opcode, Status, FEATURE_DURABLE, FEATURE_NATIVE_TTL, FEATURE_PARTITIONS, MINOR, REQUIRED_OPS};
use crate::codec::{put_bytes, put_uvarint, uvarint_len, DecodeError, Reader};
use crate::messages::{
    CommitRequest, EmptyRequest, GetRequest, InitRequest, Op, PartitionsRequest, ScanCloseRequest, ScanNextRequest,
    ScanOpenRequest, WireManifest,
};
use crate::store::{BatchWriter, Ctx, Error, HostInfo, PartitionWriter, Progress, ScanOptions, Store};

/// The scan batch size when the host leaves the choice to the plugin.
pub const DEFAULT_BATCH: usize = 128;

/// The response cap assumed until INIT says (ABI.md leaves it to INIT).
pub const DEFAULT_MAX_RESPONSE: usize = 64 << 20;

/// Room reserved in front of a scan batch for the response's head (status,
/// scan id, pair count: 1 + 10 + 10 bytes at most). The head is written
/// once the count is known, right-aligned against the pairs, and the
/// response starts where the head starts: nothing is moved.
const SCAN_HEAD: usize = 1 + 2 * 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for INIT.
    New,
    /// INIT succeeded.
    Ready,
    /// CLOSE was handled; every later call is INVALID.
    Closed,
}

/// An open scan and what the dispatcher tracks about it.
struct OpenScan<T> {
    scan: T,
    /// Pairs the scan may still yield under its limit; `None`: no limit.
    remaining: Option<u64>,
}

/// Limits a batch obeys, copied out of the dispatcher so that filling a
/// batch borrows only the store, the response and the scan.
#[derive(Clone, Copy)]
struct BatchLimits {
    max_resp: usize,
    max_scan_batch: usize,
}

/// Decodes requests, calls a [`Store`], and encodes responses.
///
/// Feed it every request with [`Dispatcher::dispatch`]; the response it
/// returns borrows its buffer and stays valid until the next call, as
/// ABI.md requires. The buffers (the response, the decoded COMMIT ops, the
/// duplicate-key table, the partition cuts) are reused, so a steady stream
/// of requests allocates nothing in the dispatcher.
pub struct Dispatcher<S: Store> {
    store: S,
    phase: Phase,
    /// The largest response the host accepts.
    max_resp: usize,
    /// The manifest's cap on pairs per batch (0: none).
    max_scan_batch: usize,
    /// The store declared PARTITIONS.
    partitions: bool,
    /// The store declared SIZE.
    size: bool,
    /// The store declared RECLAIM.
    reclaim: bool,
    resp: Vec<u8>,
    /// The decoded ops of the last COMMIT, kept empty between calls so that
    /// its allocation is reused whatever the borrow of the next request
    /// (see `recycle`).
    ops: Vec<Op<'static>>,
    dups: DupFinder,
    parts: PartitionWriter,
    scans: BTreeMap<u64, OpenScan<S::Scan>>,
    next_id: u64,
}

impl<S: Store> Dispatcher<S> {
    /// A dispatcher serving `store`, waiting for INIT.
    pub fn new(store: S) -> Self {
        Dispatcher {
            store,
            phase: Phase::New,
            max_resp: DEFAULT_MAX_RESPONSE,
            max_scan_batch: 0,
            partitions: false,
            size: false,
            reclaim: false,
            resp: Vec::new(),
            ops: Vec::new(),
            dups: DupFinder::default(),
            parts: PartitionWriter::default(),
            scans: BTreeMap::new(),
            next_id: 0,
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The store, mutably.
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// The number of scans that outlived the call that opened them and are
    /// not released yet.
    pub fn open_scans(&self) -> usize {
        self.scans.len()
    }

    /// Handles the request `req` of op code `op` and returns the response
    /// (status byte first), valid until the next call.
    pub fn dispatch(&mut self, op: i32, req: &[u8]) -> &[u8] {
        self.resp.clear();
        let mut start = self.handle(op, req);
        let len = self.resp.len().saturating_sub(start);
        if len > self.max_resp {
            let msg = format!("a response of {} bytes exceeds the host's max_response of {} bytes", len, self.max_resp);
            self.resp.clear();
            start = self.fail(Status::Internal, &[&msg]);
        }
        self.resp.get(start..).unwrap_or_default()
    }

    /// The response to a `kvp_dispatch` whose length lies outside the
    /// request buffer.
    pub fn bad_length(&mut self) -> &[u8] {
        self.resp.clear();
        self.fail(Status::Invalid, &["kvp_dispatch: request length outside the buffer"]);
        &self.resp
    }

    /// Handles one request, leaving the response in `self.resp` from the
    /// returned offset on.
    fn handle(&mut self, code: i32, req: &[u8]) -> usize {
        let op = match Opcode::from_code(code) {
            Some(op) => op,
            None => {
                let msg = format!("op {code} is not supported by this SDK (ABI 1.{MINOR})");
                return self.fail(Status::Unsupported, &[&msg]);
            }
        };
        match self.phase {
            Phase::Closed => return self.fail(Status::Invalid, &[op.name(), ": instance is closed"]),
            Phase::New if op != Opcode::Init => return self.fail(Status::Invalid, &[op.name(), " before INIT"]),
            Phase::Ready if op == Opcode::Init => return self.fail(Status::Invalid, &["INIT sent twice"]),
            _ => {}
        }
        match op {
            Opcode::Init => self.init(req),
            Opcode::Get => self.get(req),
            Opcode::ScanOpen => self.scan_open(req),
            Opcode::ScanNext => self.scan_next(req),
            Opcode::ScanClose => self.scan_close(req),
            Opcode::Commit => self.commit(req),
            Opcode::Partitions if self.partitions => self.partitions(req),
            Opcode::Partitions => {
                self.fail(Status::Unsupported, &["PARTITIONS: the store's manifest does not declare partitions"])
            }
            Opcode::Close => self.close(req),
            Opcode::Idle => self.empty_op(Opcode::Idle, req, S::idle),
            Opcode::Size if self.size => self.size(req),
            Opcode::Size => self.fail(Status::Unsupported, &["SIZE: the store's manifest does not declare size"]),
            Opcode::Reclaim if self.reclaim => self.empty_op(Opcode::Reclaim, req, S::reclaim),
            Opcode::Reclaim => {
                self.fail(Status::Unsupported, &["RECLAIM: the store's manifest does not declare reclaim"])
            }
        }
    }

    /// Writes an error response whose message is the concatenation of
    /// `parts` (no allocation to join them) and returns its offset.
    fn fail(&mut self, st: Status, parts: &[&str]) -> usize {
        self.resp.clear();
        self.resp.push(st.code());
        let n: usize = parts.iter().map(|p| p.len()).sum();
        put_uvarint(&mut self.resp, n as u64);
        for p in parts {
            self.resp.extend_from_slice(p.as_bytes());
        }
        0
    }

    fn bad_request(&mut self, op: Opcode, err: DecodeError) -> usize {
        self.fail(Status::Invalid, &[op.name(), ": malformed request: ", err.as_str()])
    }

    /// Writes the response for a store's error, with the status `op` allows:
    /// NOT_FOUND, CONFLICT and UNCERTAIN outside their ops are a store bug
    /// and become INTERNAL (sending them would be a protocol violation, a
    /// crash in the host's eyes).
    fn store_error(&mut self, op: Opcode, err: Error) -> usize {
        let st = err.status();
        if st == Status::NotFound && op == Opcode::Get {
            self.resp.clear();
            self.resp.push(st.code());
            return 0;
        }
        let prefix = match op {
            Opcode::Init => "init: ",
            Opcode::ScanOpen | Opcode::ScanNext => "scan: ",
            Opcode::ScanClose => "close scan: ",
            Opcode::Partitions => "partitions: ",
            Opcode::Close => "close: ",
            Opcode::Idle => "idle: ",
            // The host names SIZE and RECLAIM in its errors: their messages
            // go out as the store wrote them, as the golden vectors have it.
            Opcode::Get | Opcode::Commit | Opcode::Size | Opcode::Reclaim => "",
        };
        if !st.allowed_for(op) || st == Status::Ok || st == Status::Conflict {
            return self.fail(
                Status::Internal,
                &[prefix, "the store returned ", st.name(), " to ", op.name(), ": ", err.message()],
            );
        }
        self.fail(st, &[prefix, err.message()])
    }

    fn init(&mut self, req: &[u8]) -> usize {
        let m = match InitRequest::decode(req) {
            Ok(m) => m,
            Err(e) => return self.bad_request(Opcode::Init, e),
        };
        if m.max_response > 0 {
            self.max_resp = m.max_response as usize;
        }
        let host =
            HostInfo { instance: m.instance, net_allowed: m.net_allowed(), max_response: self.max_resp as u32 };
        let cx = Ctx::new(m.header.deadline);
        let man = match self.store.init(&cx, m.config, &host) {
            Ok(man) => man,
            Err(e) => return self.store_error(Opcode::Init, e),
        };
        if man.name.is_empty() {
            return self.fail(Status::Internal, &["init: Manifest.name is empty"]);
        }
        let mut ops = REQUIRED_OPS | Opcode::Idle.bit();
        let mut features = 0;
        if man.partitions {
            ops |= Opcode::Partitions.bit();
            features |= FEATURE_PARTITIONS;
        }
        if man.size {
            ops |= Opcode::Size.bit();
        }
        if man.reclaim {
            ops |= Opcode::Reclaim.bit();
        }
        if man.durable {
            features |= FEATURE_DURABLE;
        }
        if man.native_ttl {
            features |= FEATURE_NATIVE_TTL;
        }
        let wire = WireManifest {
            name: man.name.as_bytes(),
            version: man.version.as_bytes(),
            abi_minor: MINOR,
            model: man.model.code(),
            max_instances: if man.model == Model::Single { 1 } else { man.max_instances },
            ops,
            features,
            max_commit_ops: man.max_commit_ops,
            max_commit_bytes: man.max_commit_bytes,
            max_scan_batch: man.max_scan_batch,
        };
        self.resp.clear();
        self.resp.push(Status::Ok.code());
        wire.encode(&mut self.resp);
        self.partitions = man.partitions;
        self.size = man.size;
        self.reclaim = man.reclaim;
        self.max_scan_batch = man.max_scan_batch as usize;
        self.phase = Phase::Ready;
        0
    }

    fn get(&mut self, req: &[u8]) -> usize {
        let m = match GetRequest::decode(req) {
            Ok(m) => m,
            Err(e) => return self.bad_request(Opcode::Get, e),
        };
        if m.key.is_empty() {
            return self.fail(Status::Invalid, &["GET: empty key"]);
        }
        let cx = Ctx::new(m.header.deadline);
        match self.store.get(&cx, m.key) {
            Ok(v) => {
                self.resp.clear();
                self.resp.push(Status::Ok.code());
                put_bytes(&mut self.resp, v);
                0
            }
            Err(e) => self.store_error(Opcode::Get, e),
        }
    }

    fn scan_open(&mut self, req: &[u8]) -> usize {
        let m = match ScanOpenRequest::decode(req) {
            Ok(m) => m,
            Err(e) => return self.bad_request(Opcode::ScanOpen, e),
        };
        if !m.end.is_empty() && m.start >= m.end {
            // An empty range: answer without bothering the store. Id 0 is
            // never a live scan's (ids start at 1) and more=false releases
            // it at once.
            self.resp.clear();
            self.resp.extend_from_slice(&[Status::Ok.code(), 0, 0, 0]);
            return 0;
        }
        let cx = Ctx::new(m.header.deadline);
        let opts = ScanOptions { start: m.start, end: m.end, reverse: m.reverse, limit: m.limit };
        let scan = match self.store.scan(&cx, &opts) {
            Ok(s) => s,
            Err(e) => return self.store_error(Opcode::ScanOpen, e),
        };
        self.next_id += 1;
        let id = self.next_id;
        let mut open = OpenScan { scan, remaining: if m.limit > 0 { Some(m.limit) } else { None } };
        let limits = self.limits();
        match fill_batch(&mut self.store, &mut self.resp, limits, &cx, &mut open, m.batch_size, Some(id)) {
            Ok((start, true)) => {
                // Most scans end in their first batch; only those that
                // outlive this call are tracked.
                self.scans.insert(id, open);
                start
            }
            Ok((start, false)) => {
                self.store.scan_close(open.scan);
                start
            }
            Err(e) => {
                self.store.scan_close(open.scan);
                self.store_error(Opcode::ScanOpen, e)
            }
        }
    }

    fn scan_next(&mut self, req: &[u8]) -> usize {
        let m = match ScanNextRequest::decode(req) {
            Ok(m) => m,
            Err(e) => return self.bad_request(Opcode::ScanNext, e),
        };
        let cx = Ctx::new(m.header.deadline);
        let limits = self.limits();
        let open = match self.scans.get_mut(&m.id) {
            Some(open) => open,
            None => {
                let msg = format!("SCAN_NEXT: unknown scan id {}", m.id);
                return self.fail(Status::Invalid, &[&msg]);
            }
        };
        let res = fill_batch(&mut self.store, &mut self.resp, limits, &cx, open, m.batch_size, None);
        if let Ok((start, true)) = res {
            return start;
        }
        if let Some(open) = self.scans.remove(&m.id) {
            self.store.scan_close(open.scan);
        }
        match res {
            Ok((start, _)) => start,
            Err(e) => self.store_error(Opcode::ScanNext, e),
        }
    }

    fn scan_close(&mut self, req: &[u8]) -> usize {
        let m = match ScanCloseRequest::decode(req) {
            Ok(m) => m,
            Err(e) => return self.bad_request(Opcode::ScanClose, e),
        };
        // Unknown ids are fine: SCAN_CLOSE is idempotent.
        if let Some(open) = self.scans.remove(&m.id) {
            self.store.scan_close(open.scan);
        }
        self.ok()
    }

    fn commit(&mut self, req: &[u8]) -> usize {
        let mut ops = recycle(std::mem::take(&mut self.ops));
        let at = match CommitRequest::decode_into(req, &mut ops) {
            Err(e) => self.bad_request(Opcode::Commit, e),
            Ok(_) if ops.is_empty() => self.ok(),
            Ok(header) => match check_batch(&ops, &mut self.dups) {
                Some(msg) => self.fail(Status::Invalid, &["COMMIT: ", &msg]),
                None => {
                    let cx = Ctx::new(header.deadline);
                    match self.store.commit(&cx, &ops) {
                        Ok(()) => self.ok(),
                        Err(Error::Conflict { index, exists, current }) => self.conflict(ops.len(), index, exists, &current),
                        Err(e) => self.store_error(Opcode::Commit, e),
                    }
                }
            },
        };
        self.ops = recycle(ops);
        at
    }

    fn conflict(&mut self, n: usize, index: usize, exists: bool, current: &[u8]) -> usize {
        if index >= n {
            let msg = format!("the store's conflict names op {index} of a {n}-op batch");
            return self.fail(Status::Internal, &[&msg]);
        }
        self.resp.clear();
        self.resp.push(Status::Conflict.code());
        put_uvarint(&mut self.resp, index as u64);
        self.resp.push(exists as u8);
        put_bytes(&mut self.resp, if exists { current } else { &[] });
        0
    }

    fn partitions(&mut self, req: &[u8]) -> usize {
        let m = match PartitionsRequest::decode(req) {
            Ok(m) => m,
            Err(e) => return self.bad_request(Opcode::Partitions, e),
        };
        let cx = Ctx::new(m.header.deadline);
        self.parts.reset();
        if let Err(e) = self.store.partitions(&cx, m.start, m.end, m.max_parts, &mut self.parts) {
            return self.store_error(Opcode::Partitions, e);
        }
        let (cuts, n, err) = self.parts.parts();
        let bad = if let Some(e) = err {
            Some(e)
        } else if self.parts.first_cut().map_or(false, |c| c <= m.start) {
            Some("a partition cut is not after the range's start")
        } else if !m.end.is_empty() && self.parts.last_cut().map_or(false, |c| c >= m.end) {
            Some("a partition cut is not before the range's end")
        } else if m.max_parts > 0 && n >= m.max_parts as usize {
            Some("more partitions than max_parts")
        } else {
            None
        };
        if let Some(msg) = bad {
            return self.fail(Status::Internal, &["partitions: ", msg]);
        }
        // [start, c1) [c1, c2) ... [cn, end): each cut twice, as an end and
        // as the next start.
        let resp = &mut self.resp;
        resp.clear();
        resp.push(Status::Ok.code());
        put_uvarint(resp, n as u64 + 1);
        put_bytes(resp, m.start);
        let mut r = Reader::new(cuts);
        for _ in 0..n {
            let c = r.bytes().unwrap_or_default();
            put_bytes(resp, c);
            put_bytes(resp, c);
        }
        put_bytes(resp, m.end);
        0
    }

    /// Decodes the body of an op that has only the header: its context,
    /// or the INVALID response's offset.
    fn header_only(&mut self, op: Opcode, req: &[u8]) -> Result<Ctx, usize> {
        match EmptyRequest::decode(req) {
            Ok(m) => Ok(Ctx::new(m.header.deadline)),
            Err(e) => Err(self.bad_request(op, e)),
        }
    }

    /// Serves a header-only op whose OK body is empty with `call`.
    fn empty_op(&mut self, op: Opcode, req: &[u8], call: impl FnOnce(&mut S, &Ctx) -> Result<(), Error>) -> usize {
        let cx = match self.header_only(op, req) {
            Ok(cx) => cx,
            Err(at) => return at,
        };
        match call(&mut self.store, &cx) {
            Ok(()) => self.ok(),
            Err(e) => self.store_error(op, e),
        }
    }

    fn close(&mut self, req: &[u8]) -> usize {
        let cx = match self.header_only(Opcode::Close, req) {
            Ok(cx) => cx,
            Err(at) => return at,
        };
        for (_, open) in std::mem::take(&mut self.scans) {
            self.store.scan_close(open.scan);
        }
        self.phase = Phase::Closed;
        match self.store.close(&cx) {
            Ok(()) => self.ok(),
            Err(e) => self.store_error(Opcode::Close, e),
        }
    }

    fn size(&mut self, req: &[u8]) -> usize {
        let cx = match self.header_only(Opcode::Size, req) {
            Ok(cx) => cx,
            Err(at) => return at,
        };
        match self.store.size(&cx) {
            // The wire field is an i64: a larger count would make the host
            // refuse the response as malformed and discard the instance.
            Ok(n) if n > i64::MAX as u64 => {
                let msg = format!("size: the store reported {n} bytes, over 2^63-1");
                self.fail(Status::Internal, &[&msg])
            }
            Ok(n) => {
                self.resp.clear();
                self.resp.push(Status::Ok.code());
                put_uvarint(&mut self.resp, n);
                0
            }
            Err(e) => self.store_error(Opcode::Size, e),
        }
    }

    fn ok(&mut self) -> usize {
        self.resp.clear();
        self.resp.push(Status::Ok.code());
        0
    }

    fn limits(&self) -> BatchLimits {
        BatchLimits { max_resp: self.max_resp, max_scan_batch: self.max_scan_batch }
    }
}

/// Builds an OK response to SCAN_OPEN (with `id`) or SCAN_NEXT holding the
/// scan's next batch, and returns its offset in `resp` and whether the scan
/// may yield more. The caller releases the scan when it may not.
fn fill_batch<S: Store>(
    store: &mut S,
    resp: &mut Vec<u8>,
    limits: BatchLimits,
    cx: &Ctx,
    open: &mut OpenScan<S::Scan>,
    batch_size: u32,
    id: Option<u64>,
) -> Result<(usize, bool), Error> {
    let mut want = if batch_size == 0 { DEFAULT_BATCH } else { batch_size as usize };
    if limits.max_scan_batch > 0 {
        want = want.min(limits.max_scan_batch);
    }
    if let Some(rem) = open.remaining {
        want = want.min(usize::try_from(rem).unwrap_or(usize::MAX));
    }
    // The head and the more flag are outside the pairs' budget.
    let budget = limits.max_resp.saturating_sub(SCAN_HEAD + 1);
    resp.clear();
    resp.resize(SCAN_HEAD, 0);
    let (count, progress, too_big) = {
        let mut w = BatchWriter::new(resp, want, budget);
        let progress = if want == 0 { Progress::Done } else { store.scan_next(cx, &mut open.scan, &mut w)? };
        (w.len(), progress, w.too_big())
    };
    if count == 0 {
        if let Some(n) = too_big {
            return Err(Error::Internal(format!(
                "a pair of {} bytes does not fit in the host's {}-byte response limit",
                n, limits.max_resp
            )));
        }
    }
    if let Some(rem) = open.remaining.as_mut() {
        *rem = rem.saturating_sub(count as u64);
    }
    let more = progress == Progress::More && open.remaining != Some(0);
    resp.push(more as u8);
    // The head, right-aligned against the pairs.
    let head_len = 1 + id.map_or(0, uvarint_len) + uvarint_len(count as u64);
    let start = SCAN_HEAD - head_len;
    if let Some(head) = resp.get_mut(start..SCAN_HEAD) {
        head[0] = Status::Ok.code();
        let mut at = 1;
        if let Some(id) = id {
            at += write_uvarint(&mut head[at..], id);
        }
        write_uvarint(&mut head[at..], count as u64);
    }
    Ok((start, more))
}

/// Writes `v` as a varint at the start of `dst`, which has room, and
/// returns its length.
fn write_uvarint(dst: &mut [u8], mut v: u64) -> usize {
    let mut n = 0;
    for b in dst.iter_mut() {
        n += 1;
        if v < 0x80 {
            *b = v as u8;
            break;
        }
        *b = v as u8 | 0x80;
        v >>= 7;
    }
    n
}

/// Turns an emptied vector of ops borrowing one buffer into an empty vector
/// of ops borrowing another, keeping its allocation: `Op<'a>` and `Op<'b>`
/// have the same layout, and std collects a `vec::IntoIter` adapter into
/// its source allocation when layouts match. Safe code; if std ever stops
/// doing that, the cost is an allocation per COMMIT, not a bug.
// filter_map, not filter: the item type changes (its lifetime).
#[allow(clippy::unnecessary_filter_map)]
fn recycle<'a, 'b>(mut v: Vec<Op<'a>>) -> Vec<Op<'b>> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

/// Enforces the structural rules of a batch that a store may rely on:
/// non-empty keys, no key twice. The host checks them too; a plugin must
/// not trust it. Returns the INVALID message.
fn check_batch(ops: &[Op<'_>], dups: &mut DupFinder) -> Option<String> {
    if let Some(i) = ops.iter().position(|op| op.key.is_empty()) {
        return Some(format!("op {i}: empty key"));
    }
    dups.find(ops).map(|j| format!("op {}: key {} appears twice in one batch", j, show_key(ops[j].key)))
}

/// A key for a message: printable ASCII as is, other bytes as `\xNN`,
/// truncated.
fn show_key(key: &[u8]) -> String {
    const MAX: usize = 64;
    let mut s = String::with_capacity(key.len().min(MAX) + 2);
    s.push('"');
    for &b in key.iter().take(MAX) {
        if b.is_ascii_graphic() || b == b' ' {
            if b == b'"' || b == b'\\' {
                s.push('\\');
            }
            s.push(b as char);
        } else {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    s.push('"');
    if key.len() > MAX {
        s.push_str("...");
    }
    s
}

/// Finds a key named twice in a batch in linear time, allocating nothing
/// once its table has grown: an open-addressing table of key hashes, where
/// equal hashes are confirmed by comparing the keys. Batches of up to
/// `PAIRWISE` ops are compared pairwise instead, which is cheaper than
/// hashing at that size.
#[derive(Debug, Default)]
struct DupFinder {
    /// 1 + the index of the op whose key hashed here; 0 = empty.
    slots: Vec<u32>,
    hashes: Vec<u64>,
}

const PAIRWISE: usize = 8;

impl DupFinder {
    /// The index of the first op whose key an earlier op already named.
    fn find(&mut self, ops: &[Op<'_>]) -> Option<usize> {
        let n = ops.len();
        if n < 2 {
            return None;
        }
        if n <= PAIRWISE {
            return (1..n).find(|&i| ops[..i].iter().any(|o| o.key == ops[i].key));
        }
        let size = (2 * n).next_power_of_two();
        if self.slots.len() < size {
            self.slots.resize(size, 0);
            self.hashes.resize(size, 0);
        }
        let slots = &mut self.slots[..size];
        let hashes = &mut self.hashes[..size];
        slots.fill(0);
        let mask = size - 1;
        for (i, op) in ops.iter().enumerate() {
            let h = key_hash(op.key);
            let mut j = h as usize & mask;
            loop {
                let k = slots[j] as usize;
                if k == 0 {
                    slots[j] = i as u32 + 1;
                    hashes[j] = h;
                    break;
                }
                if hashes[j] == h && ops[k - 1].key == op.key {
                    return Some(i);
                }
                j = (j + 1) & mask;
            }
        }
        None
    }
}

/// Mixes a key eight bytes at a time (the fold of a 64x64-bit multiply, as
/// in wyhash). It only has to spread keys over the table: a collision costs
/// a comparison, never a wrong answer.
fn key_hash(key: &[u8]) -> u64 {
    const M1: u64 = 0xa076_1d64_78bd_642f;
    const M2: u64 = 0xe703_7ed1_a0b4_28db;
    let mut h = key.len() as u64 ^ M1;
    let mut words = key.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h = mix(h ^ u64::from_le_bytes(b), M2);
    }
    let mut t = 0u64;
    for &b in words.remainder() {
        t = (t << 8) | u64::from(b);
    }
    mix(h ^ t, M2)
}

fn mix(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r >> 64) as u64 ^ r as u64
}

#[cfg(test)]
mod tests;
