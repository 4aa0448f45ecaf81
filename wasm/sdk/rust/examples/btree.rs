//! btree-rust: an ordered in-memory key-value store as an Engram storage
//! plugin, on std's `BTreeMap` (instance model single: the data lives in
//! the instance's linear memory and dies with it).
//!
//! It is the Rust SDK's example adaptor and must pass `engram plugin
//! verify` entirely. It is written to be read: the interesting part is how
//! scans get a consistent snapshot across batches without copying the map.
//!
//! # Snapshots by versioning
//!
//! Every commit gets the next sequence number, and every entry remembers the
//! sequence of the commit that wrote its value. A scan remembers the
//! sequence it was opened at (its snapshot) and sees, for each key, the
//! newest version written at or before it: commits after it are invisible,
//! and since all ops of a commit share one sequence, a batch is never half
//! visible.
//!
//! Old versions are kept only while a scan may need them. A commit that
//! overwrites or deletes a value that some open scan can see (the value's
//! sequence is at or before the newest open snapshot) moves it to the
//! entry's `old` list and notes the key as dirty; otherwise it overwrites in
//! place, reusing the value's buffer. When the oldest open snapshot moves
//! on (a scan closes), the dirty keys drop the versions no open scan can
//! see, and deleted keys nobody can see leave the map. With no scan open
//! (the common case: most scans end within the call that opened them, and
//! no commit can run in between) a commit is a plain `BTreeMap` update:
//! O(log n), nothing copied but the new key and value.
//!
//! # Keys as words
//!
//! In wasm, comparing byte slices calls libc's `memcmp`, a loop over single
//! bytes, and keys that share long prefixes (`/registry/pods/default/...`)
//! cost a byte per comparison, a few dozen comparisons per lookup: with
//! 70-byte keys that was most of a commit's time. So the map stores each key
//! as `u64` words, each holding 7 key bytes big-endian and, in its low byte,
//! how many of them are used (1 to 7, or 8 for "7, and more words follow").
//! Comparing the word slices orders keys exactly as comparing the bytes
//! does (see `encode_key`), 7 bytes per step.
//!
//! # Size and reclaim (ABI 1.1)
//!
//! SIZE answers the bytes of the keys and values the store holds, the
//! versions kept for open scans included: a running count that every write
//! and every prune adjusts, so SIZE costs nothing however often the host
//! asks. RECLAIM gives back the slack of value buffers (a commit reuses a
//! buffer up to twice the new value's size) and of the store's scratch
//! space, in one pass over the keys that stops at the request's deadline.
//! That memory returns to the allocator for later writes: a wasm instance's
//! memory never shrinks, so the host sees no change in the instance's
//! footprint, and SIZE, which counts data rather than memory, none either.
//! Old versions need no reclaiming: they are dropped as soon as the scans
//! that read them close.

use std::collections::BTreeMap;
use std::ops::Bound;

use engram_plugin::{
    export_store, log_debug, BatchWriter, Ctx, Error, HostInfo, Manifest, Model, Op, OpKind, PartitionWriter, Progress,
    ScanOptions, Store,
};

/// The largest key and value the adaptor contract allows (ABI.md section
/// 6); the host enforces them too.
const MAX_KEY: usize = 60_000;
const MAX_VALUE: usize = 4 << 20;

/// Keys per partition: small enough that the host's PARTITIONS path is
/// exercised with more than one range by the conformance suite.
const PART_SIZE: usize = 512;

/// Encodes `key` into `out` (cleared first) as the map's word form and
/// returns it.
///
/// Why the order is the bytes' order: word by word, the first differing key
/// byte sits in the same word at the same position of both keys, in the
/// word's high bytes, so it decides. When the bytes of a word are equal
/// (padding with zeros included), the low byte decides: a key that ends in
/// this word has a smaller count than one that goes on, by more bytes in
/// the word or by further words (marker 8), and a shorter key is a prefix,
/// which sorts first. The empty key is the empty slice, the smallest.
fn encode_key<'a>(key: &[u8], out: &'a mut Vec<u64>) -> &'a [u64] {
    out.clear();
    let mut chunks = key.chunks(7).peekable();
    while let Some(c) = chunks.next() {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        w[7] = if chunks.peek().is_some() { 8 } else { c.len() as u8 };
        out.push(u64::from_be_bytes(w));
    }
    out
}

/// The length in bytes of a key in word form: 7 per word but the last,
/// whose low byte says how many of its bytes are used.
fn key_len(words: &[u64]) -> u64 {
    match words.last() {
        None => 0,
        Some(last) => 7 * (words.len() as u64 - 1) + u64::from(last.to_be_bytes()[7]).min(7),
    }
}

/// The length of a value, or 0 for a deletion.
fn value_len(v: &Option<Vec<u8>>) -> u64 {
    v.as_ref().map_or(0, |v| v.len() as u64)
}

/// Decodes a key's word form into `out` (cleared first) and returns it.
fn decode_key<'a>(words: &[u64], out: &'a mut Vec<u8>) -> &'a [u8] {
    out.clear();
    // Seven bytes of every word, then drop the last word's padding: copies
    // of a constant size compile to a few stores, where a copy of a
    // variable size is a call (this runs for every pair a scan returns).
    for w in words {
        let b = w.to_be_bytes();
        let seven: &[u8; 7] = b[..7].try_into().unwrap_or(&[0; 7]);
        out.extend_from_slice(seven);
    }
    if let Some(last) = words.last() {
        let unused = 7 - usize::from(last.to_be_bytes()[7]).min(7);
        out.truncate(out.len() - unused);
    }
    out
}

/// A superseded value, kept for open scans.
#[derive(Debug)]
struct Version {
    /// The commit that wrote it.
    seq: u64,
    /// `None`: the key was deleted by that commit.
    value: Option<Vec<u8>>,
}

/// A key's state: its latest value and the older ones open scans may need.
#[derive(Debug)]
struct Entry {
    /// The commit that wrote `value`.
    seq: u64,
    /// The latest value; `None` only while `old` is non-empty (a deletion
    /// that an open scan must not see yet).
    value: Option<Vec<u8>>,
    /// Older versions, oldest first; empty unless the key is in `dirty`.
    old: Vec<Version>,
}

impl Entry {
    /// The value a scan at snapshot `snap` sees.
    fn at(&self, snap: u64) -> Option<&[u8]> {
        if self.seq <= snap {
            return self.value.as_deref();
        }
        // Not found: the key did not exist yet at `snap`.
        self.old.iter().rev().find(|v| v.seq <= snap).and_then(|v| v.value.as_deref())
    }
}

/// The map: keys in word form ([`encode_key`]), ordered as their bytes.
type Map = BTreeMap<Box<[u64]>, Entry>;

/// The store.
#[derive(Debug, Default)]
pub struct BTreeStore {
    map: Map,
    /// The sequence of the last commit.
    seq: u64,
    /// The bytes of the keys and values held, old versions included: what
    /// SIZE answers.
    held: u64,
    /// Open scans per snapshot sequence.
    open: BTreeMap<u64, u32>,
    /// Keys whose entry has old versions, to prune when the oldest open
    /// snapshot moves on. Empty whenever no scan is open.
    dirty: Vec<Box<[u64]>>,
    /// Scratch space for a key in word form, and one in bytes, reused by
    /// every call.
    words: Vec<u64>,
    bytes: Vec<u8>,
}

/// A scan's own state: its snapshot, bounds and position. It owns copies of
/// its bounds (the request buffer they came from is reused) and reads the
/// map through the store on each batch.
#[derive(Debug)]
pub struct BTreeScan {
    snap: u64,
    /// `start` then `end` in word form, in one allocation.
    bounds: Vec<u64>,
    split: usize,
    /// The range has an upper bound (an encoded empty `end` is empty too).
    bounded: bool,
    reverse: bool,
    /// The last key returned, once a batch has ended before the scan did.
    last: Option<Vec<u64>>,
}

impl BTreeStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Unregisters a scan at `snap` and prunes versions if the oldest open
    /// snapshot moved on.
    fn release(&mut self, snap: u64) {
        let oldest = self.open.keys().next().copied();
        if let Some(n) = self.open.get_mut(&snap) {
            *n -= 1;
            if *n == 0 {
                self.open.remove(&snap);
            }
        }
        if !self.dirty.is_empty() && self.open.keys().next().copied() != oldest {
            self.prune();
        }
    }

    /// Drops the versions no open scan can see: for each dirty key, all but
    /// the newest version at or before the oldest open snapshot (all of
    /// them when no scan is open); removes deleted keys left with no
    /// version. Costs one lookup per dirty key, so the work is proportional
    /// to the writes made while scans were open.
    fn prune(&mut self) {
        let oldest = self.open.keys().next().copied();
        let (map, held) = (&mut self.map, &mut self.held);
        self.dirty.retain(|key| {
            let e = match map.get_mut(key) {
                Some(e) => e,
                None => return false,
            };
            let dropped = match oldest {
                Some(o) if e.seq > o => e.old.iter().rposition(|v| v.seq <= o).unwrap_or(0),
                _ => e.old.len(),
            };
            *held -= e.old.drain(..dropped).map(|v| value_len(&v.value)).sum::<u64>();
            if !e.old.is_empty() {
                return true;
            }
            if e.value.is_none() {
                map.remove(key);
                *held -= key_len(key);
            }
            false
        });
    }
}

/// The store's fields a commit changes, borrowed apart from its scratch
/// space, which holds the key being written.
struct Writer<'s> {
    map: &'s mut Map,
    dirty: &'s mut Vec<Box<[u64]>>,
    held: &'s mut u64,
    seq: u64,
    /// The newest open snapshot, if any.
    newest_snap: Option<u64>,
}

impl Writer<'_> {
    /// Writes (`Some`) or deletes (`None`) `key` in commit `seq`, keeping
    /// the value it replaces if a scan at or before `newest_snap` can see
    /// it.
    fn write(&mut self, key: &[u64], value: Option<&[u8]>) {
        let (seq, held) = (self.seq, &mut *self.held);
        let e = match self.map.get_mut(key) {
            Some(e) => e,
            None => {
                // An absent key: nothing to keep (a scan cannot see a
                // version that did not exist), and deleting it is a no-op.
                if let Some(v) = value {
                    *held += key_len(key) + v.len() as u64;
                    self.map.insert(Box::from(key), Entry { seq, value: Some(v.to_vec()), old: Vec::new() });
                }
                return;
            }
        };
        *held += value.map_or(0, |v| v.len() as u64);
        if self.newest_snap.map_or(false, |s| e.seq <= s) {
            if e.old.is_empty() {
                self.dirty.push(Box::from(key));
            }
            let prev = std::mem::replace(&mut e.value, value.map(<[u8]>::to_vec));
            e.old.push(Version { seq: e.seq, value: prev });
            e.seq = seq;
            return;
        }
        e.seq = seq;
        *held -= value_len(&e.value);
        overwrite(e, value);
        if e.value.is_none() && e.old.is_empty() {
            self.map.remove(key);
            *held -= key_len(key);
        }
    }
}

/// Replaces an entry's latest value in place.
fn overwrite(e: &mut Entry, value: Option<&[u8]>) {
    match (value, &mut e.value) {
        // Reuse the buffer unless it would waste more than it saves.
        (Some(v), Some(buf)) if buf.capacity() >= v.len() && buf.capacity() <= 2 * v.len() + 64 => {
            buf.clear();
            buf.extend_from_slice(v);
        }
        (Some(v), slot) => *slot = Some(v.to_vec()),
        (None, slot) => *slot = None,
    }
}

/// Pushes the visible pairs of `iter` into `out` until it refuses one;
/// returns whether pairs may remain and the last key pushed.
fn fill<'a>(
    iter: impl Iterator<Item = (&'a Box<[u64]>, &'a Entry)>,
    snap: u64,
    out: &mut BatchWriter<'_>,
    scratch: &mut Vec<u8>,
) -> (Progress, Option<&'a [u64]>) {
    let mut last = None;
    for (k, e) in iter {
        if let Some(v) = e.at(snap) {
            if !out.push(decode_key(k, scratch), v) {
                return (Progress::More, last);
            }
            last = Some(&k[..]);
        }
    }
    (Progress::Done, last)
}

/// The bounds of a range of the map.
type KeyRange<'k> = (Bound<&'k [u64]>, Bound<&'k [u64]>);

/// A `BTreeMap::range` argument, or `None` if the range is empty: `range`
/// panics on an inverted range, which must never happen here.
fn bounds<'k>(lo: Bound<&'k [u64]>, hi: Bound<&'k [u64]>) -> Option<KeyRange<'k>> {
    let key = |b: &Bound<&'k [u64]>| match *b {
        Bound::Included(k) | Bound::Excluded(k) => Some(k),
        Bound::Unbounded => None,
    };
    if let (Some(l), Some(h)) = (key(&lo), key(&hi)) {
        if l >= h {
            return None;
        }
    }
    Some((lo, hi))
}

impl Store for BTreeStore {
    type Scan = BTreeScan;

    fn init(&mut self, _cx: &Ctx, config: &[u8], host: &HostInfo) -> Result<Manifest, Error> {
        if !config.iter().all(u8::is_ascii_whitespace) {
            return Err(Error::Invalid(format!(
                "btree-rust takes no configuration, got {:?}",
                String::from_utf8_lossy(config)
            )));
        }
        *self = BTreeStore::new();
        log_debug!("btree-rust: instance {} ready (max response {} bytes)", host.instance, host.max_response);
        let mut m = Manifest::new("btree-rust", "1.2.0", Model::Single);
        m.partitions = true;
        m.size = true;
        m.reclaim = true;
        Ok(m)
    }

    fn get(&mut self, _cx: &Ctx, key: &[u8]) -> Result<&[u8], Error> {
        let k = encode_key(key, &mut self.words);
        self.map.get(k).and_then(|e| e.value.as_deref()).ok_or(Error::NotFound)
    }

    fn scan(&mut self, _cx: &Ctx, opts: &ScanOptions<'_>) -> Result<BTreeScan, Error> {
        let mut b = Vec::with_capacity((opts.start.len() + opts.end.len()) / 7 + 2);
        b.extend_from_slice(encode_key(opts.start, &mut self.words));
        let split = b.len();
        b.extend_from_slice(encode_key(opts.end, &mut self.words));
        *self.open.entry(self.seq).or_insert(0) += 1;
        Ok(BTreeScan {
            snap: self.seq,
            bounds: b,
            split,
            bounded: !opts.end.is_empty(),
            reverse: opts.reverse,
            last: None,
        })
    }

    fn scan_next(&mut self, _cx: &Ctx, scan: &mut BTreeScan, out: &mut BatchWriter<'_>) -> Result<Progress, Error> {
        let (start, end) = scan.bounds.split_at(scan.split.min(scan.bounds.len()));
        let end_bound = if scan.bounded { Bound::Excluded(end) } else { Bound::Unbounded };
        let last = scan.last.as_deref();
        let (progress, new_last) = if scan.reverse {
            let hi = last.map_or(end_bound, Bound::Excluded);
            match bounds(Bound::Included(start), hi) {
                Some(r) => fill(self.map.range::<[u64], _>(r).rev(), scan.snap, out, &mut self.bytes),
                None => (Progress::Done, None),
            }
        } else {
            let lo = last.map_or(Bound::Included(start), Bound::Excluded);
            match bounds(lo, end_bound) {
                Some(r) => fill(self.map.range::<[u64], _>(r), scan.snap, out, &mut self.bytes),
                None => (Progress::Done, None),
            }
        };
        if progress == Progress::More {
            if let Some(k) = new_last {
                let buf = scan.last.get_or_insert_with(Vec::new);
                buf.clear();
                buf.extend_from_slice(k);
            }
        }
        Ok(progress)
    }

    fn scan_close(&mut self, scan: BTreeScan) {
        self.release(scan.snap);
    }

    fn commit(&mut self, _cx: &Ctx, ops: &[Op<'_>]) -> Result<(), Error> {
        // Check everything before writing anything: all or nothing.
        for (i, op) in ops.iter().enumerate() {
            if op.key.len() > MAX_KEY || op.value.len() > MAX_VALUE {
                return Err(Error::Invalid(format!(
                    "op {}: key of {} bytes or value of {} bytes over the limits",
                    i,
                    op.key.len(),
                    op.value.len()
                )));
            }
            if matches!(op.kind, OpKind::Put | OpKind::Delete) {
                continue;
            }
            let k = encode_key(op.key, &mut self.words);
            let cur = self.map.get(k).and_then(|e| e.value.as_deref());
            let ok = match op.kind {
                OpKind::PutIfAbsent => cur.is_none(),
                _ => cur == Some(op.expected),
            };
            if !ok {
                return Err(Error::Conflict {
                    index: i,
                    exists: cur.is_some(),
                    current: cur.unwrap_or_default().to_vec(),
                });
            }
        }
        let seq = self.seq + 1;
        let mut w = Writer {
            map: &mut self.map,
            dirty: &mut self.dirty,
            held: &mut self.held,
            seq,
            newest_snap: self.open.keys().next_back().copied(),
        };
        for op in ops {
            let value = if op.kind.has_value() { Some(op.value) } else { None };
            w.write(encode_key(op.key, &mut self.words), value);
        }
        self.seq = seq;
        Ok(())
    }

    fn size(&mut self, _cx: &Ctx) -> Result<u64, Error> {
        Ok(self.held)
    }

    /// See the module documentation. A deadline that passes mid-way ends
    /// the pass with DEADLINE: what was shrunk stays shrunk, and what the
    /// store holds is unchanged either way.
    fn reclaim(&mut self, cx: &Ctx) -> Result<(), Error> {
        const CHECK_EVERY: usize = 4096;
        let total = self.map.len();
        for (i, e) in self.map.values_mut().enumerate() {
            if i % CHECK_EVERY == CHECK_EVERY - 1 && cx.expired() {
                return Err(Error::Deadline(format!("reclaim: the deadline passed after {i} of {total} keys")));
            }
            if let Some(v) = e.value.as_mut() {
                v.shrink_to_fit();
            }
        }
        self.dirty.shrink_to_fit();
        self.words = Vec::new();
        self.bytes = Vec::new();
        Ok(())
    }

    fn partitions(
        &mut self,
        _cx: &Ctx,
        start: &[u8],
        end: &[u8],
        max_parts: u32,
        out: &mut PartitionWriter,
    ) -> Result<(), Error> {
        let mut b = encode_key(start, &mut self.words).to_vec();
        let split = b.len();
        b.extend_from_slice(encode_key(end, &mut self.words));
        let (lo, hi) = b.split_at(split);
        let hi = if end.is_empty() { Bound::Unbounded } else { Bound::Excluded(hi) };
        let r = match bounds(Bound::Included(lo), hi) {
            Some(r) => r,
            None => return Ok(()),
        };
        let max_cuts = if max_parts == 0 { usize::MAX } else { max_parts as usize - 1 };
        let live = self.map.range::<[u64], _>(r).filter(|(_, e)| e.value.is_some());
        for (n, (k, _)) in live.enumerate() {
            if out.len() >= max_cuts {
                break;
            }
            if n > 0 && n % PART_SIZE == 0 {
                out.cut(decode_key(k, &mut self.bytes));
            }
        }
        Ok(())
    }

    fn close(&mut self, _cx: &Ctx) -> Result<(), Error> {
        *self = BTreeStore::new();
        Ok(())
    }
}

export_store!(BTreeStore::new());

#[cfg(test)]
mod tests {
    use super::*;
    use engram_plugin::abi::{Opcode, Status};
    use engram_plugin::messages::{
        CommitRequest, EmptyRequest, GetRequest, Header, InitRequest, Response, ScanCloseRequest, ScanNextRequest,
        ScanOpenRequest,
    };
    use engram_plugin::Dispatcher;

    type Model = BTreeMap<Vec<u8>, Vec<u8>>;

    fn enc(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut b = Vec::new();
        f(&mut b);
        b
    }

    fn ready() -> Dispatcher<BTreeStore> {
        let mut d = Dispatcher::new(BTreeStore::new());
        let init = enc(|b| InitRequest::default().encode(b));
        let resp = d.dispatch(Opcode::Init.code(), &init).to_vec();
        match Response::decode(Opcode::Init, &resp) {
            Ok(Response::Manifest(m)) => {
                let want = Opcode::Partitions.bit() | Opcode::Size.bit() | Opcode::Reclaim.bit();
                assert_eq!(m.ops & want, want, "ops 0x{:x}", m.ops);
            }
            other => panic!("INIT: {other:?}"),
        }
        d
    }

    fn commit(d: &mut Dispatcher<BTreeStore>, ops: &[Op<'_>]) -> Vec<u8> {
        let req = enc(|b| CommitRequest { header: Header::default(), ops: ops.to_vec() }.encode(b));
        d.dispatch(Opcode::Commit.code(), &req).to_vec()
    }

    fn put<'a>(k: &'a [u8], v: &'a [u8]) -> Op<'a> {
        Op { kind: OpKind::Put, key: k, value: v, expected: b"" }
    }

    fn del(k: &[u8]) -> Op<'_> {
        Op { kind: OpKind::Delete, key: k, value: b"", expected: b"" }
    }

    fn get(d: &mut Dispatcher<BTreeStore>, k: &[u8]) -> Option<Vec<u8>> {
        let req = enc(|b| GetRequest { header: Header::default(), key: k }.encode(b));
        match Response::decode(Opcode::Get, d.dispatch(Opcode::Get.code(), &req)) {
            Ok(Response::Value(v)) => Some(v.to_vec()),
            Ok(Response::NotFound) => None,
            other => panic!("GET: {other:?}"),
        }
    }

    /// Opens a scan and returns its id (0 if it ended) and first batch.
    fn open(d: &mut Dispatcher<BTreeStore>, reverse: bool, batch: u32) -> (u64, Vec<(Vec<u8>, Vec<u8>)>) {
        let req = enc(|b| ScanOpenRequest { reverse, batch_size: batch, ..Default::default() }.encode(b));
        match Response::decode(Opcode::ScanOpen, d.dispatch(Opcode::ScanOpen.code(), &req)) {
            Ok(Response::ScanOpened { id, pairs, more }) => {
                (if more { id } else { 0 }, pairs.iter().map(|p| (p.key.to_vec(), p.value.to_vec())).collect())
            }
            other => panic!("SCAN_OPEN: {other:?}"),
        }
    }

    /// The next batch of scan `id`, and its new id (0 once it ended).
    fn next(d: &mut Dispatcher<BTreeStore>, id: u64, batch: u32) -> (u64, Vec<(Vec<u8>, Vec<u8>)>) {
        let req = enc(|b| ScanNextRequest { header: Header::default(), id, batch_size: batch }.encode(b));
        match Response::decode(Opcode::ScanNext, d.dispatch(Opcode::ScanNext.code(), &req)) {
            Ok(Response::Batch { pairs, more }) => {
                (if more { id } else { 0 }, pairs.iter().map(|p| (p.key.to_vec(), p.value.to_vec())).collect())
            }
            other => panic!("SCAN_NEXT: {other:?}"),
        }
    }

    /// SIZE, through the dispatcher.
    fn size(d: &mut Dispatcher<BTreeStore>) -> u64 {
        match Response::decode(Opcode::Size, d.dispatch(Opcode::Size.code(), &[0])) {
            Ok(Response::Size(n)) => n,
            other => panic!("SIZE: {other:?}"),
        }
    }

    /// The bytes of keys and values the map holds, counted the slow way.
    fn held_by_walking(s: &BTreeStore) -> u64 {
        let mut buf = Vec::new();
        s.map
            .iter()
            .map(|(k, e)| {
                decode_key(k, &mut buf).len() as u64
                    + value_len(&e.value)
                    + e.old.iter().map(|v| value_len(&v.value)).sum::<u64>()
            })
            .sum()
    }

    fn assert_clean(d: &Dispatcher<BTreeStore>) {
        let s = d.store();
        assert_eq!(s.held, held_by_walking(s), "the running count of bytes held drifted");
        assert!(s.open.is_empty(), "scans still registered: {:?}", s.open);
        assert!(s.dirty.is_empty(), "{} dirty keys with no scan open", s.dirty.len());
        for (k, e) in &s.map {
            assert!(e.old.is_empty() && e.value.is_some(), "key {k:?} kept {e:?} with no scan open");
        }
    }

    /// The word form orders keys exactly as their bytes, including zero
    /// bytes, prefixes and the 7-byte word boundaries.
    #[test]
    fn word_keys_keep_byte_order() {
        let mut rng = Rng(42);
        let alphabet = [0u8, 1, 7, 8, 0x7f, 0x80, 0xfe, 0xff];
        let mut keys: Vec<Vec<u8>> = vec![vec![]];
        for _ in 0..2000 {
            let n = rng.below(24) as usize;
            keys.push((0..n).map(|_| alphabet[rng.below(8) as usize]).collect());
        }
        for n in 0..=22 {
            keys.push(vec![0; n]);
            keys.push(vec![0xff; n]);
        }
        let (mut wa, mut wb, mut back) = (Vec::new(), Vec::new(), Vec::new());
        for a in &keys {
            assert_eq!(decode_key(encode_key(a, &mut wa), &mut back), &a[..]);
            for _ in 0..20 {
                let b = &keys[rng.below(keys.len() as u64) as usize];
                let (ea, eb) = (encode_key(a, &mut wa), encode_key(b, &mut wb));
                assert_eq!(ea.cmp(eb), a.cmp(b), "{a:x?} vs {b:x?}");
            }
        }
    }

    #[test]
    fn a_scan_does_not_see_later_commits() {
        let mut d = ready();
        let ops: Vec<(Vec<u8>, Vec<u8>)> = (b'a'..=b'e').map(|c| (vec![c], vec![c, b'1'])).collect();
        let batch: Vec<Op<'_>> = ops.iter().map(|(k, v)| put(k, v)).collect();
        assert_eq!(commit(&mut d, &batch), [0]);
        let (id, first) = open(&mut d, false, 2);
        assert_eq!(first, ops[..2].to_vec());
        assert_eq!(commit(&mut d, &[put(b"c", b"c2"), del(b"d"), put(b"bb", b"new"), put(b"f", b"new")]), [0]);
        assert_eq!(get(&mut d, b"d"), None);
        assert_eq!(get(&mut d, b"c"), Some(b"c2".to_vec()));
        let (id2, rest) = next(&mut d, id, 10);
        assert_eq!(id2, 0, "the scan should end");
        assert_eq!(rest, ops[2..].to_vec(), "the scan saw a later commit");
        assert_clean(&d);
        // A new scan sees everything.
        let (_, all) = open(&mut d, true, 0);
        let keys: Vec<Vec<u8>> = all.into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, vec![b"f".to_vec(), b"e".to_vec(), b"c".to_vec(), b"bb".to_vec(), b"b".to_vec(), b"a".to_vec()]);
    }

    #[test]
    fn size_counts_keys_and_values_held() {
        let mut d = ready();
        assert_eq!(size(&mut d), 0);
        assert_eq!(commit(&mut d, &[put(b"a", b"xyz"), put(b"0123456789abcdef", b"")]), [0]);
        assert_eq!(size(&mut d), 1 + 3 + 16);
        assert_eq!(commit(&mut d, &[put(b"a", b"xy"), del(b"absent")]), [0]);
        assert_eq!(size(&mut d), 1 + 2 + 16);
        // A scan held open keeps the versions it reads, and SIZE counts them.
        let (id, first) = open(&mut d, false, 1);
        assert_eq!(first, vec![(b"0123456789abcdef".to_vec(), vec![])]);
        assert_eq!(commit(&mut d, &[put(b"a", b"1234"), del(b"0123456789abcdef")]), [0]);
        assert_eq!(size(&mut d), 1 + 2 + 16 + 4);
        assert_eq!(d.store().held, held_by_walking(d.store()));
        assert_eq!(next(&mut d, id, 10), (0, vec![(b"a".to_vec(), b"xy".to_vec())]));
        assert_eq!(size(&mut d), 1 + 4, "the scan's versions were dropped when it ended");
        assert_clean(&d);
        assert_eq!(commit(&mut d, &[del(b"a")]), [0]);
        assert_eq!(size(&mut d), 0);
    }

    #[test]
    fn reclaim_shrinks_value_buffers_and_keeps_every_key() {
        let mut d = ready();
        let keys: Vec<Vec<u8>> = (0..5000).map(|i| format!("key{i:05}").into_bytes()).collect();
        let long = vec![b'x'; 100];
        for k in &keys {
            assert_eq!(commit(&mut d, &[put(k, &long)]), [0]);
            // Reuses the 100-byte buffer for 60 bytes: 40 bytes of slack.
            assert_eq!(commit(&mut d, &[put(k, &long[..60])]), [0]);
        }
        let slack = |s: &BTreeStore| s.map.values().filter_map(|e| e.value.as_ref()).map(|v| v.capacity() - v.len()).sum::<usize>();
        assert!(slack(d.store()) >= 5000 * 40, "no slack to reclaim: {}", slack(d.store()));
        let before = size(&mut d);
        // A deadline already passed stops the pass at its first check.
        let mut late = Vec::new();
        EmptyRequest { header: Header { deadline: 1 } }.encode(&mut late);
        match Response::decode(Opcode::Reclaim, d.dispatch(Opcode::Reclaim.code(), &late)) {
            Ok(Response::Error { status: Status::Deadline, message }) => {
                assert!(String::from_utf8_lossy(message).contains("after 4095 of 5000 keys"), "{message:?}")
            }
            other => panic!("RECLAIM past its deadline: {other:?}"),
        }
        assert_eq!(Response::decode(Opcode::Reclaim, d.dispatch(Opcode::Reclaim.code(), &[0])), Ok(Response::Ok));
        assert_eq!(slack(d.store()), 0);
        assert_eq!(size(&mut d), before, "RECLAIM changed what the store holds");
        for k in &keys {
            assert_eq!(get(&mut d, k).as_deref(), Some(&long[..60]));
        }
        assert_clean(&d);
    }

    #[test]
    fn conflicts_apply_nothing() {
        let mut d = ready();
        assert_eq!(commit(&mut d, &[put(b"k", b"v")]), [0]);
        let cas = Op { kind: OpKind::CompareAndSwap, key: b"k", value: b"w", expected: b"other" };
        let resp = commit(&mut d, &[put(b"x", b"1"), cas]);
        assert_eq!(
            Response::decode(Opcode::Commit, &resp),
            Ok(Response::Conflict { index: 1, exists: true, current: b"v" })
        );
        assert_eq!(get(&mut d, b"x"), None, "a failed batch was half applied");
        let pia = Op { kind: OpKind::PutIfAbsent, key: b"k", value: b"w", expected: b"" };
        let cad = Op { kind: OpKind::CompareAndDelete, key: b"absent", value: b"", expected: b"" };
        let resp = commit(&mut d, &[cad, pia]);
        assert_eq!(
            Response::decode(Opcode::Commit, &resp),
            Ok(Response::Conflict { index: 0, exists: false, current: b"" }),
            "an absent key never matches, even an empty expected value"
        );
        let cas = Op { kind: OpKind::CompareAndSwap, key: b"k", value: b"w", expected: b"v" };
        assert_eq!(commit(&mut d, &[cas]), [0]);
        assert_eq!(get(&mut d, b"k"), Some(b"w".to_vec()));
        let big = vec![b'k'; MAX_KEY + 1];
        let resp = commit(&mut d, &[put(&big, b"")]);
        assert!(matches!(Response::decode(Opcode::Commit, &resp), Ok(Response::Error { status: Status::Invalid, .. })));
    }

    /// A tiny deterministic generator (xorshift64*), so failures reproduce.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Interleaves random commits with many scans opened at different
    /// moments, each read batch by batch, and checks every scan against a
    /// copy of the model taken when it opened; at the end no version is
    /// left behind.
    #[test]
    fn random_scans_match_their_snapshot() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut d = ready();
        let mut model = Model::new();
        // (id, batch size, reverse, expected pairs, pairs seen so far)
        let mut scans: Vec<(u64, u32, Vec<(Vec<u8>, Vec<u8>)>, Vec<(Vec<u8>, Vec<u8>)>)> = Vec::new();
        for round in 0..3000 {
            match rng.below(10) {
                0..=5 => {
                    let n = 1 + rng.below(6) as usize;
                    let mut keys: Vec<Vec<u8>> = (0..n).map(|_| format!("k{:03}", rng.below(200)).into_bytes()).collect();
                    keys.sort();
                    keys.dedup();
                    let vals: Vec<Vec<u8>> = keys.iter().map(|_| format!("v{round}").into_bytes()).collect();
                    let dels: Vec<bool> = keys.iter().map(|_| rng.below(3) == 0).collect();
                    let ops: Vec<Op<'_>> = keys
                        .iter()
                        .zip(&vals)
                        .zip(&dels)
                        .map(|((k, v), &x)| if x { del(k) } else { put(k, v) })
                        .collect();
                    assert_eq!(commit(&mut d, &ops), [0]);
                    assert_eq!(size(&mut d), held_by_walking(d.store()), "round {round}");
                    for ((k, v), &x) in keys.iter().zip(&vals).zip(&dels) {
                        if x {
                            model.remove(k);
                        } else {
                            model.insert(k.clone(), v.clone());
                        }
                    }
                }
                6 | 7 => {
                    let batch = 1 + rng.below(40) as u32;
                    let reverse = rng.below(2) == 0;
                    let mut want: Vec<(Vec<u8>, Vec<u8>)> = model.clone().into_iter().collect();
                    if reverse {
                        want.reverse();
                    }
                    let (id, first) = open(&mut d, reverse, batch);
                    if id == 0 {
                        assert_eq!(first, want, "round {round}: single-batch scan");
                    } else {
                        scans.push((id, batch, want, first));
                    }
                }
                8 if !scans.is_empty() => {
                    let i = rng.below(scans.len() as u64) as usize;
                    let (id, batch) = (scans[i].0, scans[i].1);
                    let (id2, pairs) = next(&mut d, id, batch);
                    scans[i].3.extend(pairs);
                    if id2 == 0 {
                        let (_, _, want, got) = scans.swap_remove(i);
                        assert!(got == want, "round {round}: scan {id} saw something other than its snapshot");
                    }
                }
                _ if !scans.is_empty() && rng.below(4) == 0 => {
                    // The host gives up on a scan.
                    let i = rng.below(scans.len() as u64) as usize;
                    let (id, ..) = scans.swap_remove(i);
                    let req = enc(|b| ScanCloseRequest { header: Header::default(), id }.encode(b));
                    assert_eq!(d.dispatch(Opcode::ScanClose.code(), &req), [0]);
                }
                _ => {}
            }
        }
        // Drain what is left.
        for (id, batch, want, mut got) in scans {
            let mut id = id;
            while id != 0 {
                let (id2, pairs) = next(&mut d, id, batch);
                got.extend(pairs);
                id = id2;
            }
            assert!(got == want, "scan drained at the end saw something other than its snapshot");
        }
        assert_clean(&d);
        let live: usize = model.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert_eq!(size(&mut d), live as u64, "with no scan open, SIZE is the live keys and values");
        let all: Model = model.clone();
        assert_eq!(d.store().map.len(), all.len());
        for (k, v) in &all {
            assert_eq!(get(&mut d, k).as_ref(), Some(v));
        }
    }
}
