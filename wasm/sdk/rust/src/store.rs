//! What a plugin author implements ([`Store`]) and the types its methods
//! take and return.
//!
//! This module owns the plugin-facing contract: the trait, the manifest a
//! store declares, the errors it returns, the per-request [`Ctx`], and the
//! two writers through which a store hands results to the SDK without
//! building intermediate vectors ([`BatchWriter`] for scans,
//! [`PartitionWriter`] for partitions). It does not decode or encode
//! messages beyond what those writers append, and it never calls a store.

use std::fmt;
use std::io;
use std::time::Duration;

use crate::abi::Model;
use crate::codec::{bytes_len, put_bytes};
use crate::messages::Op;

/// A storage engine served as an Engram plugin.
///
/// The SDK calls a store **one call at a time**: the host never sends an
/// instance two requests at once, and nothing in the instance runs between
/// calls (no background threads, no timers). A method therefore has the
/// store to itself and must not block longer than the request's deadline
/// ([`Ctx::deadline`]).
///
/// **Borrowed arguments.** Byte slices passed in (keys, values, [`Op`]
/// fields, scan bounds, the INIT config) borrow the SDK's request buffer,
/// which the host overwrites with the next request: copy what you keep.
/// Slices you return ([`Store::get`]'s value) or push ([`BatchWriter::push`])
/// are copied into the response before the method's borrow of `self` ends,
/// so they may point into the store's own data.
///
/// **Errors and what they promise.** [`Error::NotFound`] is for `get` only;
/// [`Error::Conflict`] and [`Error::Uncertain`] for `commit` only. Returned
/// elsewhere they become INTERNAL. Every status but UNCERTAIN promises the
/// host that nothing of a COMMIT was applied.
///
/// **Never panic.** On `wasm32-wasi` a panic aborts, which traps the
/// instance: the host treats it as a crash (and for [`Model::Single`] stops
/// serving the store, whose data died with the instance). Return an error
/// instead.
pub trait Store {
    /// Per-scan state (a cursor, a snapshot handle, a remote transaction).
    /// It owns what it needs: it outlives the call that opened it, and the
    /// store is borrowed mutably by other calls (commits) in between, so it
    /// cannot borrow the store. [`Store::scan_next`] gets both.
    type Scan;

    /// Configures a fresh instance with the operator's config
    /// (`storage.wasm.config`, verbatim) and describes the plugin. It is the
    /// first call on every instance; an error refuses the instance and, at
    /// load time, the plugin (return [`Error::Invalid`] for a bad config).
    fn init(&mut self, cx: &Ctx, config: &[u8], host: &HostInfo) -> Result<Manifest, Error>;

    /// Returns `key`'s latest committed value (observing every COMMIT that
    /// returned OK before), or [`Error::NotFound`]. `key` is never empty.
    fn get(&mut self, cx: &Ctx, key: &[u8]) -> Result<&[u8], Error>;

    /// Opens a scan over a consistent snapshot of `[opts.start, opts.end)`:
    /// commits that returned OK before are visible, later ones are not, and
    /// a batch is never half visible. The range is never empty (the SDK
    /// answers empty ranges itself). Copy the bounds if the scan keeps them.
    fn scan(&mut self, cx: &Ctx, opts: &ScanOptions<'_>) -> Result<Self::Scan, Error>;

    /// Pushes the scan's next pairs, in the scan's order, into `out` until
    /// [`BatchWriter::push`] refuses one (the batch is full: do not advance
    /// past the refused pair, it is offered again next time) or the scan
    /// ends. Returns [`Progress::Done`] when no pair is left: the SDK then
    /// releases the scan with [`Store::scan_close`]. [`Progress::More`] with
    /// fewer pairs than `out` could take is allowed (the host asks again).
    /// The SDK enforces the scan's limit and the host's response size, so a
    /// store need not.
    fn scan_next(&mut self, cx: &Ctx, scan: &mut Self::Scan, out: &mut BatchWriter<'_>) -> Result<Progress, Error>;

    /// Releases a scan: when it is done, when the host closes it, when a
    /// batch failed, and for every open scan before [`Store::close`]. The
    /// default drops it.
    fn scan_close(&mut self, scan: Self::Scan) {
        drop(scan);
    }

    /// Applies `ops` atomically: all or none. Conditions are checked
    /// against the state at commit time; if any fails, nothing is written
    /// and the error is [`Error::Conflict`] for the **lowest** failing
    /// index. The SDK guarantees that `ops` is non-empty, that no key is
    /// empty and that no key appears twice. An OK means durable to the
    /// engine's promise ([`Manifest::durable`]); [`Error::Uncertain`] means
    /// the outcome is unknown (a timeout after sending); any other error
    /// means nothing was applied.
    fn commit(&mut self, cx: &Ctx, ops: &[Op<'_>]) -> Result<(), Error>;

    /// Releases the engine. It is the last call; the instance is discarded
    /// afterwards whatever the answer. Open scans were closed before.
    fn close(&mut self, cx: &Ctx) -> Result<(), Error>;

    /// Splits `[start, end)` (an empty `end` is unbounded) into contiguous
    /// ranges by pushing the cut points, in increasing order, strictly
    /// inside the range, at most `max_parts - 1` of them when `max_parts`
    /// is non-zero. No cut at all is one range, the whole. Called only if
    /// [`Manifest::partitions`] is set; the default is UNSUPPORTED.
    fn partitions(
        &mut self,
        cx: &Ctx,
        start: &[u8],
        end: &[u8],
        max_parts: u32,
        out: &mut PartitionWriter,
    ) -> Result<(), Error> {
        let _ = (cx, start, end, max_parts, out);
        Err(Error::Unsupported("PARTITIONS is not implemented by this store".into()))
    }

    /// Housekeeping while nothing waits (ping connections, drop expired
    /// state). The host sends IDLE now and then to an instance with no
    /// request in flight; answer quickly. The default does nothing.
    fn idle(&mut self, cx: &Ctx) -> Result<(), Error> {
        let _ = cx;
        Ok(())
    }

    /// How many bytes the engine's data for this store takes: on disk for a
    /// durable engine, what it holds in memory otherwise (ABI 1.1). Engram
    /// reports it as etcd's DbSize and its size metric, and enforces the
    /// backend quota with it, so it is asked often: keep a running count
    /// rather than walk the data. A count above `i64::MAX` is answered
    /// INTERNAL (the wire field is an i64). Called only if
    /// [`Manifest::size`] is set; without it the host has no size for the
    /// store (the quota cannot be enforced). The default is UNSUPPORTED.
    fn size(&mut self, cx: &Ctx) -> Result<u64, Error> {
        let _ = cx;
        Err(Error::Unsupported("SIZE is not implemented by this store".into()))
    }

    /// Does the engine's space reclamation now, for etcd's Defragment
    /// (ABI 1.1): drop what deleted keys and superseded versions still
    /// take, compact, give space back as far as the engine can. Every live
    /// key stays readable and every committed write durable: it changes
    /// where data sits, never what the store holds. It may take long (the
    /// request's deadline applies: [`Error::Deadline`] once it passed), but
    /// the host serialises an instance's calls, so a [`Model::Single`]
    /// store holds every commit while it runs: keep it bounded. Called only
    /// if [`Manifest::reclaim`] is set; without it Defragment succeeds with
    /// no work. The default is UNSUPPORTED.
    fn reclaim(&mut self, cx: &Ctx) -> Result<(), Error> {
        let _ = cx;
        Err(Error::Unsupported("RECLAIM is not implemented by this store".into()))
    }
}

/// What [`Store::scan_next`] says about the rest of the scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Pairs may remain: the host may ask for another batch.
    More,
    /// The scan is exhausted; the SDK releases it.
    Done,
}

/// What [`Store::init`] learns about the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostInfo {
    /// This instance's index in the host's pool (0 for [`Model::Single`]);
    /// a replacement instance reuses the index it replaces.
    pub instance: u32,
    /// The operator allowed at least one network address, so
    /// [`crate::net::TcpConn::connect`] may succeed.
    pub net_allowed: bool,
    /// The largest response the host accepts, in bytes; the SDK splits scan
    /// batches to stay below it.
    pub max_response: u32,
}

/// A plugin's description, returned by [`Store::init`]. The SDK derives the
/// wire manifest from it (op bits, feature bits, the ABI minor).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// Identifies the engine in logs and metrics; must not be empty.
    pub name: String,
    /// The plugin's version, free-form.
    pub version: String,
    /// The instance model (ABI.md section 5).
    pub model: Model,
    /// Caps the host's pool (0: no cap). Ignored for [`Model::Single`],
    /// which is always one instance.
    pub max_instances: u32,
    /// The store implements [`Store::partitions`]: the SDK then advertises
    /// the PARTITIONS op and the partitions feature.
    pub partitions: bool,
    /// The store implements [`Store::size`]: the SDK then advertises the
    /// SIZE op (ABI 1.1).
    pub size: bool,
    /// The store implements [`Store::reclaim`]: the SDK then advertises the
    /// RECLAIM op (ABI 1.1).
    pub reclaim: bool,
    /// An acknowledged commit survives a crash of Engram and of the plugin
    /// (never true for data kept in the plugin's memory).
    pub durable: bool,
    /// The engine expires keys by itself (advisory).
    pub native_ttl: bool,
    /// Caps the ops of one commit (0: none); the host refuses bigger ones.
    pub max_commit_ops: u32,
    /// Caps the encoded size of one COMMIT body (0: none).
    pub max_commit_bytes: u32,
    /// Caps the pairs of one scan batch (0: none).
    pub max_scan_batch: u32,
}

impl Manifest {
    /// A manifest with every option off and no limits.
    pub fn new(name: impl Into<String>, version: impl Into<String>, model: Model) -> Manifest {
        Manifest {
            name: name.into(),
            version: version.into(),
            model,
            max_instances: 0,
            partitions: false,
            size: false,
            reclaim: false,
            durable: false,
            native_ttl: false,
            max_commit_ops: 0,
            max_commit_bytes: 0,
            max_scan_batch: 0,
        }
    }
}

/// A scan's range and direction. The slices borrow the request buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanOptions<'a> {
    /// Inclusive lower bound; empty means the first key.
    pub start: &'a [u8],
    /// Exclusive upper bound; empty means no upper bound.
    pub end: &'a [u8],
    /// Descending order, from the last key below `end`.
    pub reverse: bool,
    /// Caps the pairs of the whole scan (0: none). The SDK enforces it, so
    /// a store may ignore it or use it as a hint.
    pub limit: u64,
}

/// The context of one request: its deadline.
///
/// Deadlines come from the host. The host also applies the request's
/// deadline to every `net_*` call made while serving it (a read blocked past
/// it returns a timeout), so a store rarely needs to check: use
/// [`Ctx::timeout`] to bound work that makes no host call, and
/// [`Error::Deadline`] to report giving up. A call that runs far past its
/// deadline is interrupted at its next host call and the instance is
/// discarded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ctx {
    deadline: i64,
}

impl Ctx {
    /// A context with the deadline of a request header (unix nanoseconds,
    /// 0 for none).
    pub fn new(deadline_unix_ns: i64) -> Ctx {
        Ctx { deadline: deadline_unix_ns.max(0) }
    }

    /// The deadline in nanoseconds since the Unix epoch, if the request has
    /// one.
    pub fn deadline(&self) -> Option<i64> {
        if self.deadline > 0 {
            Some(self.deadline)
        } else {
            None
        }
    }

    /// The time left before the deadline (zero once it passed), if any.
    /// Reads the host's wall clock.
    pub fn timeout(&self) -> Option<Duration> {
        let d = self.deadline()?;
        let left = d.saturating_sub(crate::clock::now_unix_ns());
        Some(Duration::from_nanos(left.max(0) as u64))
    }

    /// Whether the deadline has passed.
    pub fn expired(&self) -> bool {
        self.timeout() == Some(Duration::ZERO)
    }
}

/// Why a store call failed; each variant selects a response status.
/// Messages are UTF-8 text for the host's log and the caller's error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// GET of an absent key (NOT_FOUND). `get` only.
    NotFound,
    /// A commit condition failed; nothing was written (CONFLICT).
    /// `commit` only.
    Conflict {
        /// The lowest failing op's index in the batch.
        index: usize,
        /// Whether the key was present at commit time.
        exists: bool,
        /// The key's value at commit time (ignored when absent).
        current: Vec<u8>,
    },
    /// The commit's outcome is unknown (UNCERTAIN). `commit` only.
    Uncertain(String),
    /// The store does not implement this (UNSUPPORTED).
    Unsupported(String),
    /// The request is refused as malformed or too large, nothing applied
    /// (INVALID).
    Invalid(String),
    /// The engine cannot be reached now, nothing applied; a retry may work
    /// (UNAVAILABLE).
    Unavailable(String),
    /// The deadline passed before the work was done, nothing applied
    /// (DEADLINE). For a commit that may have been sent, use
    /// [`Error::Uncertain`].
    Deadline(String),
    /// Anything else, nothing applied (INTERNAL).
    Internal(String),
}

impl Error {
    /// The status this error selects.
    pub fn status(&self) -> crate::abi::Status {
        use crate::abi::Status;
        match self {
            Error::NotFound => Status::NotFound,
            Error::Conflict { .. } => Status::Conflict,
            Error::Uncertain(_) => Status::Uncertain,
            Error::Unsupported(_) => Status::Unsupported,
            Error::Invalid(_) => Status::Invalid,
            Error::Unavailable(_) => Status::Unavailable,
            Error::Deadline(_) => Status::Deadline,
            Error::Internal(_) => Status::Internal,
        }
    }

    /// The message of the variants that carry one.
    pub fn message(&self) -> &str {
        match self {
            Error::NotFound => "not found",
            Error::Conflict { exists: true, .. } => "conflict: the key holds a different value",
            Error::Conflict { exists: false, .. } => "conflict: the key is absent",
            Error::Uncertain(m)
            | Error::Unsupported(m)
            | Error::Invalid(m)
            | Error::Unavailable(m)
            | Error::Deadline(m)
            | Error::Internal(m) => m,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Conflict { index, .. } => write!(f, "{} (op {})", self.message(), index),
            _ => write!(f, "{}: {}", self.status().name(), self.message()),
        }
    }
}

impl std::error::Error for Error {}

/// Maps an I/O error (from [`crate::net::TcpConn`] or a driver on top of
/// it) to a status: timeouts are DEADLINE, connection failures UNAVAILABLE,
/// the rest INTERNAL. A commit that may have reached the server before the
/// error should say [`Error::Uncertain`] instead; the SDK cannot know.
impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        let msg = e.to_string();
        match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Error::Deadline(msg),
            io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::NotConnected
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::PermissionDenied => Error::Unavailable(msg),
            _ => Error::Internal(msg),
        }
    }
}

/// The sink of one scan batch, writing pairs straight into the response
/// buffer: no intermediate vector, no copy of pairs that fit.
///
/// It takes pairs until the batch holds as many as the host asked for
/// (bounded by the scan's limit and the manifest's `max_scan_batch`) or the
/// next pair would make the response longer than the host accepts.
pub struct BatchWriter<'r> {
    buf: &'r mut Vec<u8>,
    count: usize,
    want: usize,
    budget: usize,
    full: bool,
    /// The size of a pair refused while the batch was empty: it can never
    /// fit, and the scan cannot progress.
    too_big: Option<usize>,
}

impl<'r> BatchWriter<'r> {
    /// A writer appending to `buf`, taking at most `want` pairs of at most
    /// `budget` encoded bytes in all.
    pub(crate) fn new(buf: &'r mut Vec<u8>, want: usize, budget: usize) -> Self {
        BatchWriter { buf, count: 0, want, budget, full: want == 0, too_big: None }
    }

    /// Appends one pair if it fits, and reports whether it did. When it
    /// returns false the pair was not taken and the batch is complete:
    /// stop, and offer that pair first in the next batch.
    #[inline]
    pub fn push(&mut self, key: &[u8], value: &[u8]) -> bool {
        if self.full {
            return false;
        }
        let n = bytes_len(key.len()) + bytes_len(value.len());
        if self.count >= self.want || n > self.budget {
            if self.count == 0 {
                self.too_big = Some(key.len() + value.len());
            }
            self.full = true;
            return false;
        }
        self.buf.reserve(n);
        put_bytes(self.buf, key);
        put_bytes(self.buf, value);
        self.budget -= n;
        self.count += 1;
        true
    }

    /// Whether the batch refuses further pairs.
    pub fn is_full(&self) -> bool {
        self.full || self.count >= self.want
    }

    /// How many more pairs the batch takes at most (fewer if they are
    /// large): a hint for a store that fetches rows in chunks.
    pub fn remaining(&self) -> usize {
        if self.full {
            0
        } else {
            self.want - self.count
        }
    }

    /// The pairs pushed so far.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no pair was pushed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub(crate) fn too_big(&self) -> Option<usize> {
        self.too_big
    }
}

/// The sink of [`Store::partitions`]: the cut points between ranges. The
/// SDK turns cuts `c1 < c2 < ...` of `[start, end)` into the ranges
/// `[start, c1) [c1, c2) ... [cn, end)`, so the ranges are contiguous by
/// construction. Reused across calls.
#[derive(Debug, Default)]
pub struct PartitionWriter {
    /// The cuts, each encoded as a `bytes` field.
    cuts: Vec<u8>,
    count: usize,
    /// Where the last cut's bytes start in `cuts`, to check the order.
    last: usize,
    error: Option<&'static str>,
}

impl PartitionWriter {
    pub(crate) fn reset(&mut self) {
        self.cuts.clear();
        self.count = 0;
        self.last = 0;
        self.error = None;
    }

    /// Adds a cut point. Cuts must be strictly increasing and strictly
    /// inside the range; a cut that is not makes the SDK answer INTERNAL
    /// (a bug in the store), so the host never sees overlapping ranges.
    pub fn cut(&mut self, key: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if key.is_empty() {
            self.error = Some("a partition cut is empty");
            return;
        }
        if self.count > 0 {
            let prev = crate::codec::Reader::new(self.cuts.get(self.last..).unwrap_or_default()).bytes();
            if prev.map_or(true, |p| p >= key) {
                self.error = Some("partition cuts are not strictly increasing");
                return;
            }
        }
        self.last = self.cuts.len();
        put_bytes(&mut self.cuts, key);
        self.count += 1;
    }

    /// The number of cuts so far (ranges = cuts + 1).
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no cut was made.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub(crate) fn parts(&self) -> (&[u8], usize, Option<&'static str>) {
        (&self.cuts, self.count, self.error)
    }

    /// The last cut, if any.
    pub(crate) fn last_cut(&self) -> Option<&[u8]> {
        if self.count == 0 {
            return None;
        }
        crate::codec::Reader::new(self.cuts.get(self.last..).unwrap_or_default()).bytes().ok()
    }

    /// The first cut, if any.
    pub(crate) fn first_cut(&self) -> Option<&[u8]> {
        if self.count == 0 {
            return None;
        }
        crate::codec::Reader::new(&self.cuts).bytes().ok()
    }
}
