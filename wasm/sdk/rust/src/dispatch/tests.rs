//! Native tests of the dispatcher: every response is decoded back with the
//! codec (as the host would) and checked against what the store holds.

use super::*;
use crate::abi::OpKind;
use crate::messages::{Header, Pair, Response};
use crate::runtime::Runtime;
use crate::store::Manifest;

type Kv = (Vec<u8>, Vec<u8>);

/// An op as the store saw it: kind, key, value, expected.
type OwnedOp = (OpKind, Vec<u8>, Vec<u8>, Vec<u8>);

/// A store over a sorted vector, recording what the dispatcher hands it.
#[derive(Default)]
struct TestStore {
    data: BTreeMap<Vec<u8>, Vec<u8>>,
    partitions: bool,
    cuts: Vec<Vec<u8>>,
    max_scan_batch: u32,
    /// Pairs pushed per scan_next call at most (0: as many as fit).
    per_next: usize,
    name: &'static str,
    scans_opened: usize,
    scans_closed: usize,
    store_calls: usize,
    last_ops: Vec<OwnedOp>,
    commit_error: Option<Error>,
    get_error: Option<Error>,
    last_limit: u64,
    /// What size answers; `None`: SIZE is not declared.
    size: Option<Result<u64, Error>>,
    /// What reclaim answers; `None`: RECLAIM is not declared.
    reclaim: Option<Result<(), Error>>,
    reclaims: usize,
}

struct TestScan {
    pairs: Vec<Kv>,
    pos: usize,
}

impl Store for TestStore {
    type Scan = TestScan;

    fn init(&mut self, _cx: &Ctx, _config: &[u8], _host: &HostInfo) -> Result<Manifest, Error> {
        let mut m = Manifest::new(if self.name.is_empty() { "test" } else { self.name }, "1", Model::Single);
        m.partitions = self.partitions;
        m.size = self.size.is_some();
        m.reclaim = self.reclaim.is_some();
        m.max_scan_batch = self.max_scan_batch;
        Ok(m)
    }

    fn size(&mut self, _cx: &Ctx) -> Result<u64, Error> {
        self.store_calls += 1;
        self.size.clone().unwrap_or(Ok(0))
    }

    fn reclaim(&mut self, _cx: &Ctx) -> Result<(), Error> {
        self.store_calls += 1;
        self.reclaims += 1;
        self.reclaim.clone().unwrap_or(Ok(()))
    }

    fn get(&mut self, _cx: &Ctx, key: &[u8]) -> Result<&[u8], Error> {
        self.store_calls += 1;
        if let Some(e) = self.get_error.clone() {
            return Err(e);
        }
        self.data.get(key).map(|v| v.as_slice()).ok_or(Error::NotFound)
    }

    fn scan(&mut self, _cx: &Ctx, opts: &ScanOptions<'_>) -> Result<TestScan, Error> {
        self.store_calls += 1;
        self.scans_opened += 1;
        self.last_limit = opts.limit;
        let mut pairs: Vec<Kv> = self
            .data
            .iter()
            .filter(|(k, _)| k.as_slice() >= opts.start && (opts.end.is_empty() || k.as_slice() < opts.end))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if opts.reverse {
            pairs.reverse();
        }
        Ok(TestScan { pairs, pos: 0 })
    }

    fn scan_next(&mut self, _cx: &Ctx, scan: &mut TestScan, out: &mut BatchWriter<'_>) -> Result<Progress, Error> {
        let mut pushed = 0;
        while let Some((k, v)) = scan.pairs.get(scan.pos) {
            if self.per_next > 0 && pushed == self.per_next {
                return Ok(Progress::More);
            }
            if !out.push(k, v) {
                return Ok(Progress::More);
            }
            scan.pos += 1;
            pushed += 1;
        }
        Ok(Progress::Done)
    }

    fn scan_close(&mut self, _scan: TestScan) {
        self.scans_closed += 1;
    }

    fn commit(&mut self, _cx: &Ctx, ops: &[Op<'_>]) -> Result<(), Error> {
        self.store_calls += 1;
        self.last_ops =
            ops.iter().map(|o| (o.kind, o.key.to_vec(), o.value.to_vec(), o.expected.to_vec())).collect();
        if let Some(e) = self.commit_error.clone() {
            return Err(e);
        }
        for op in ops {
            match op.kind {
                OpKind::Delete | OpKind::CompareAndDelete => {
                    self.data.remove(op.key);
                }
                _ => {
                    self.data.insert(op.key.to_vec(), op.value.to_vec());
                }
            }
        }
        Ok(())
    }

    fn close(&mut self, _cx: &Ctx) -> Result<(), Error> {
        Ok(())
    }

    fn partitions(
        &mut self,
        _cx: &Ctx,
        _start: &[u8],
        _end: &[u8],
        _max: u32,
        out: &mut PartitionWriter,
    ) -> Result<(), Error> {
        for c in &self.cuts {
            out.cut(c);
        }
        Ok(())
    }
}

fn enc(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = Vec::new();
    f(&mut b);
    b
}

fn init_req(max_response: u32) -> Vec<u8> {
    enc(|b| InitRequest { max_response, ..Default::default() }.encode(b))
}

fn ready(store: TestStore, max_response: u32) -> Dispatcher<TestStore> {
    let mut d = Dispatcher::new(store);
    let resp = d.dispatch(1, &init_req(max_response)).to_vec();
    assert!(matches!(Response::decode(Opcode::Init, &resp), Ok(Response::Manifest(_))), "INIT: {resp:x?}");
    d
}

fn get(key: &[u8]) -> Vec<u8> {
    enc(|b| GetRequest { header: Header::default(), key }.encode(b))
}

fn commit(ops: &[Op<'_>]) -> Vec<u8> {
    enc(|b| CommitRequest { header: Header::default(), ops: ops.to_vec() }.encode(b))
}

fn put<'a>(key: &'a [u8], value: &'a [u8]) -> Op<'a> {
    Op { kind: OpKind::Put, key, value, expected: b"" }
}

fn decode(op: Opcode, resp: &[u8]) -> Response<'_> {
    match Response::decode(op, resp) {
        Ok(r) => r,
        Err(e) => panic!("{}: undecodable response {:x?}: {}", op.name(), resp, e),
    }
}

/// The status and message of an error response.
fn error_of(op: Opcode, resp: &[u8]) -> (Status, String) {
    match decode(op, resp) {
        Response::Error { status, message } => (status, String::from_utf8_lossy(message).into_owned()),
        other => panic!("{}: want an error, got {:?}", op.name(), other),
    }
}

#[test]
fn lifecycle_rules() {
    let mut d = Dispatcher::new(TestStore::default());
    assert_eq!(error_of(Opcode::Get, d.dispatch(2, &get(b"k"))), (Status::Invalid, "GET before INIT".into()));
    let resp = d.dispatch(1, &init_req(0)).to_vec();
    match decode(Opcode::Init, &resp) {
        Response::Manifest(m) => {
            assert_eq!(m.name, b"test");
            assert_eq!(m.model, Model::Single.code());
            assert_eq!(m.max_instances, 1);
            assert_eq!(m.ops, REQUIRED_OPS | Opcode::Idle.bit());
            assert_eq!(m.features, 0);
            assert_eq!(m.abi_minor, 1);
        }
        other => panic!("INIT: {other:?}"),
    }
    assert_eq!(error_of(Opcode::Init, d.dispatch(1, &init_req(0))).0, Status::Invalid);
    assert_eq!(error_of(Opcode::Get, d.dispatch(2, &[0x80])).0, Status::Invalid);
    assert_eq!(error_of(Opcode::Get, d.dispatch(200, &[0])).0, Status::Unsupported);
    assert_eq!(error_of(Opcode::Get, d.dispatch(-1, &[0])).0, Status::Unsupported);
    assert_eq!(error_of(Opcode::Partitions, d.dispatch(7, &[0, 0, 0, 0])).0, Status::Unsupported);
    assert_eq!(error_of(Opcode::Size, d.dispatch(10, &[0])).0, Status::Unsupported, "SIZE undeclared");
    assert_eq!(error_of(Opcode::Reclaim, d.dispatch(11, &[0])).0, Status::Unsupported, "RECLAIM undeclared");
    assert_eq!(d.store().store_calls, 0, "undeclared ops reached the store");
    assert_eq!(decode(Opcode::Idle, d.dispatch(9, &[0])), Response::Ok);
    assert_eq!(error_of(Opcode::Idle, d.dispatch(9, &[0, 0])).0, Status::Invalid, "trailing byte");
    assert_eq!(decode(Opcode::Close, d.dispatch(8, &[0])), Response::Ok);
    assert_eq!(error_of(Opcode::Get, d.dispatch(2, &get(b"k"))).0, Status::Invalid, "GET after CLOSE");
}

#[test]
fn size_and_reclaim() {
    let mut d = Dispatcher::new(TestStore { size: Some(Ok(12345)), reclaim: Some(Ok(())), ..Default::default() });
    let resp = d.dispatch(1, &init_req(0)).to_vec();
    match decode(Opcode::Init, &resp) {
        Response::Manifest(m) => {
            assert_eq!(m.ops, REQUIRED_OPS | Opcode::Idle.bit() | Opcode::Size.bit() | Opcode::Reclaim.bit());
            assert_eq!(m.ops, 0xf7e);
            assert_eq!(m.features, 0, "SIZE and RECLAIM are ops, not features");
        }
        other => panic!("INIT: {other:?}"),
    }
    assert_eq!(d.dispatch(10, &[0]), [0, 0xb9, 0x60], "SIZE 12345");
    assert_eq!(decode(Opcode::Reclaim, d.dispatch(11, &[0])), Response::Ok);
    assert_eq!(d.store().reclaims, 1);
    d.store_mut().size = Some(Ok(i64::MAX as u64));
    assert_eq!(decode(Opcode::Size, d.dispatch(10, &[0])), Response::Size(i64::MAX as u64));
    d.store_mut().size = Some(Ok(i64::MAX as u64 + 1));
    let (st, msg) = error_of(Opcode::Size, d.dispatch(10, &[0]));
    assert_eq!(st, Status::Internal, "a count over an i64: {msg}");
    assert!(msg.contains("2^63"), "{msg}");
    // The statuses both may answer pass through with their messages...
    for e in [
        Error::Unsupported("u".into()),
        Error::Invalid("i".into()),
        Error::Unavailable("down".into()),
        Error::Deadline("late".into()),
        Error::Internal("bug".into()),
    ] {
        d.store_mut().size = Some(Err(e.clone()));
        assert_eq!(error_of(Opcode::Size, d.dispatch(10, &[0])), (e.status(), e.message().to_string()));
        d.store_mut().reclaim = Some(Err(e.clone()));
        assert_eq!(error_of(Opcode::Reclaim, d.dispatch(11, &[0])), (e.status(), e.message().to_string()));
    }
    // ...the others would be protocol violations: INTERNAL.
    for e in [Error::NotFound, Error::Uncertain("?".into()), Error::Conflict { index: 0, exists: false, current: vec![] }]
    {
        d.store_mut().size = Some(Err(e.clone()));
        assert_eq!(error_of(Opcode::Size, d.dispatch(10, &[0])).0, Status::Internal, "size: {e:?}");
        d.store_mut().reclaim = Some(Err(e.clone()));
        assert_eq!(error_of(Opcode::Reclaim, d.dispatch(11, &[0])).0, Status::Internal, "reclaim: {e:?}");
    }
    for op in [10, 11] {
        let (st, msg) = error_of(Opcode::Size, d.dispatch(op, &[0, 0]));
        assert!(st == Status::Invalid && msg.contains("malformed"), "op {op} with a trailing byte: {msg}");
    }
}

#[test]
fn manifest_flags_and_empty_name() {
    let d = ready(TestStore { partitions: true, ..Default::default() }, 0);
    drop(d);
    let mut d = Dispatcher::new(TestStore { partitions: true, max_scan_batch: 7, ..Default::default() });
    let resp = d.dispatch(1, &init_req(0)).to_vec();
    match decode(Opcode::Init, &resp) {
        Response::Manifest(m) => {
            assert_eq!(m.ops, 0x3fe);
            assert_eq!(m.features, FEATURE_PARTITIONS);
            assert_eq!(m.max_scan_batch, 7);
        }
        other => panic!("INIT: {other:?}"),
    }
    struct Nameless;
    impl Store for Nameless {
        type Scan = ();
        fn init(&mut self, _: &Ctx, _: &[u8], _: &HostInfo) -> Result<Manifest, Error> {
            Ok(Manifest::new("", "", Model::Pooled))
        }
        fn get(&mut self, _: &Ctx, _: &[u8]) -> Result<&[u8], Error> {
            Err(Error::NotFound)
        }
        fn scan(&mut self, _: &Ctx, _: &ScanOptions<'_>) -> Result<(), Error> {
            Ok(())
        }
        fn scan_next(&mut self, _: &Ctx, _: &mut (), _: &mut BatchWriter<'_>) -> Result<Progress, Error> {
            Ok(Progress::Done)
        }
        fn commit(&mut self, _: &Ctx, _: &[Op<'_>]) -> Result<(), Error> {
            Ok(())
        }
        fn close(&mut self, _: &Ctx) -> Result<(), Error> {
            Ok(())
        }
    }
    let mut d = Dispatcher::new(Nameless);
    assert_eq!(error_of(Opcode::Init, d.dispatch(1, &init_req(0))).0, Status::Internal);
    assert_eq!(error_of(Opcode::Get, d.dispatch(2, &get(b"k"))).0, Status::Invalid, "a refused INIT leaves it new");
}

#[test]
fn get_statuses() {
    let mut store = TestStore::default();
    store.data.insert(b"k".to_vec(), b"v".to_vec());
    let mut d = ready(store, 0);
    assert_eq!(decode(Opcode::Get, d.dispatch(2, &get(b"k"))), Response::Value(b"v"));
    assert_eq!(d.dispatch(2, &get(b"missing")), &[1]);
    assert_eq!(error_of(Opcode::Get, d.dispatch(2, &get(b""))), (Status::Invalid, "GET: empty key".into()));
    // Statuses GET may not send become INTERNAL rather than a protocol
    // violation.
    d.store_mut().get_error = Some(Error::Uncertain("lost".into()));
    let (st, msg) = error_of(Opcode::Get, d.dispatch(2, &get(b"k")));
    assert_eq!(st, Status::Internal);
    assert!(msg.contains("UNCERTAIN") && msg.contains("lost"), "{msg}");
    d.store_mut().get_error = Some(Error::Unavailable("down".into()));
    assert_eq!(error_of(Opcode::Get, d.dispatch(2, &get(b"k"))), (Status::Unavailable, "down".into()));
}

#[test]
fn responses_over_max_response_become_internal() {
    let mut store = TestStore::default();
    store.data.insert(b"big".to_vec(), vec![7; 500]);
    let mut d = ready(store, 200);
    let (st, msg) = error_of(Opcode::Get, d.dispatch(2, &get(b"big")));
    assert_eq!(st, Status::Internal);
    assert!(msg.contains("max_response"), "{msg}");
}

#[test]
fn commit_refuses_empty_and_duplicate_keys_before_the_store() {
    let mut d = ready(TestStore::default(), 0);
    let (st, msg) = error_of(Opcode::Commit, d.dispatch(6, &commit(&[put(b"a", b"1"), put(b"b", b"2"), put(b"a", b"3")])));
    assert_eq!(st, Status::Invalid);
    assert!(msg.starts_with("COMMIT: op 2: key \"a\""), "{msg}");
    let (st, msg) = error_of(Opcode::Commit, d.dispatch(6, &commit(&[put(b"a", b"1"), put(b"", b"2")])));
    assert_eq!(st, Status::Invalid);
    assert_eq!(msg, "COMMIT: op 1: empty key");
    assert_eq!(d.store().store_calls, 0, "the store saw an invalid batch");
    assert_eq!(decode(Opcode::Commit, d.dispatch(6, &commit(&[]))), Response::Ok);
    assert_eq!(d.store().store_calls, 0, "an empty batch reached the store");
    // A malformed body (unknown kind) is INVALID too.
    let mut bad = commit(&[put(b"a", b"1")]);
    bad[2] = 9;
    assert_eq!(error_of(Opcode::Commit, d.dispatch(6, &bad)).0, Status::Invalid);
    let cas = Op { kind: OpKind::CompareAndSwap, key: b"c", value: b"new", expected: b"old" };
    assert_eq!(decode(Opcode::Commit, d.dispatch(6, &commit(&[put(b"a", b"1"), cas]))), Response::Ok);
    assert_eq!(d.store().last_ops[1], (OpKind::CompareAndSwap, b"c".to_vec(), b"new".to_vec(), b"old".to_vec()));
}

#[test]
fn commit_errors() {
    let mut d = ready(TestStore::default(), 0);
    let req = commit(&[put(b"a", b"1"), put(b"b", b"2")]);
    d.store_mut().commit_error = Some(Error::Conflict { index: 1, exists: true, current: b"cur".to_vec() });
    assert_eq!(decode(Opcode::Commit, d.dispatch(6, &req)), Response::Conflict { index: 1, exists: true, current: b"cur" });
    d.store_mut().commit_error = Some(Error::Conflict { index: 0, exists: false, current: b"ignored".to_vec() });
    assert_eq!(decode(Opcode::Commit, d.dispatch(6, &req)), Response::Conflict { index: 0, exists: false, current: b"" });
    d.store_mut().commit_error = Some(Error::Conflict { index: 2, exists: false, current: vec![] });
    assert_eq!(error_of(Opcode::Commit, d.dispatch(6, &req)).0, Status::Internal, "index out of range");
    d.store_mut().commit_error = Some(Error::Uncertain("timeout".into()));
    assert_eq!(error_of(Opcode::Commit, d.dispatch(6, &req)), (Status::Uncertain, "timeout".into()));
    d.store_mut().commit_error = Some(Error::NotFound);
    assert_eq!(error_of(Opcode::Commit, d.dispatch(6, &req)).0, Status::Internal);
}

#[test]
fn duplicate_finder() {
    let mut f = DupFinder::default();
    for n in [2usize, 3, 8, 9, 16, 17, 100, 1000] {
        let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("/registry/leases/kube-node-lease/node-{i}").into_bytes()).collect();
        let mut ops: Vec<Op<'_>> =
            keys.iter().map(|k| Op { kind: OpKind::Delete, key: k, value: b"", expected: b"" }).collect();
        assert_eq!(f.find(&ops), None, "{n} distinct keys");
        // Keys that are prefixes of each other are distinct.
        let mut prefixes = vec![
            Op { kind: OpKind::Delete, key: b"abcdefgh", value: b"", expected: b"" },
            Op { kind: OpKind::Delete, key: b"abcdefghi", value: b"", expected: b"" },
            Op { kind: OpKind::Delete, key: b"abcdefg", value: b"", expected: b"" },
        ];
        prefixes.extend_from_slice(&ops);
        assert_eq!(f.find(&prefixes), None, "{n} keys with prefixes");
        for (a, b) in [(0, 1), (0, n - 1), (n / 2, n - 1), (n - 2, n - 1)] {
            if a == b {
                continue;
            }
            let saved = ops[b];
            ops[b].key = ops[a].key;
            assert_eq!(f.find(&ops), Some(b), "{n} ops, op {b} repeating op {a}");
            ops[b] = saved;
        }
    }
}

fn numbered(n: usize) -> BTreeMap<Vec<u8>, Vec<u8>> {
    (0..n).map(|i| (format!("k{i:04}").into_bytes(), vec![i as u8; i % 37])).collect()
}

fn scan_open(start: &[u8], end: &[u8], reverse: bool, limit: u64, batch_size: u32) -> Vec<u8> {
    enc(|b| ScanOpenRequest { header: Header::default(), start, end, reverse, limit, batch_size }.encode(b))
}

/// Runs a whole scan, checking every response's encoding, size and batch
/// size, and returns the pairs.
fn run_scan(d: &mut Dispatcher<TestStore>, open: &[u8], batch: u32, max_resp: usize) -> Vec<Kv> {
    let resp = d.dispatch(3, open).to_vec();
    assert!(resp.len() <= max_resp, "SCAN_OPEN response of {} bytes over {}", resp.len(), max_resp);
    let (id, mut more, mut all) = match decode(Opcode::ScanOpen, &resp) {
        Response::ScanOpened { id, pairs, more } => {
            assert_eq!(enc(|b| Response::ScanOpened { id, pairs: pairs.clone(), more }.encode(b)), resp);
            assert!(batch == 0 || pairs.len() <= batch as usize, "first batch of {} pairs, asked {}", pairs.len(), batch);
            (id, more, owned(&pairs))
        }
        other => panic!("SCAN_OPEN: {other:?}"),
    };
    while more {
        let req = enc(|b| ScanNextRequest { header: Header::default(), id, batch_size: batch }.encode(b));
        let resp = d.dispatch(4, &req).to_vec();
        assert!(resp.len() <= max_resp, "SCAN_NEXT response of {} bytes over {}", resp.len(), max_resp);
        match decode(Opcode::ScanNext, &resp) {
            Response::Batch { pairs, more: m } => {
                assert_eq!(enc(|b| Response::Batch { pairs: pairs.clone(), more: m }.encode(b)), resp);
                assert!(batch == 0 || pairs.len() <= batch as usize, "batch of {} pairs, asked {}", pairs.len(), batch);
                all.extend(owned(&pairs));
                more = m;
            }
            other => panic!("SCAN_NEXT: {other:?}"),
        }
    }
    all
}

fn owned(pairs: &[Pair<'_>]) -> Vec<Kv> {
    pairs.iter().map(|p| (p.key.to_vec(), p.value.to_vec())).collect()
}

#[test]
fn scan_batches_split_under_limits() {
    let data = numbered(300);
    let everything: Vec<Kv> = data.clone().into_iter().collect();
    // (batch size, limit, pairs per scan_next, max_response, max_scan_batch)
    let cases: &[(u32, u64, usize, u32, u32)] = &[
        (0, 0, 0, 0, 0),
        (0, 0, 7, 0, 0),
        (1, 0, 1, 0, 0),
        (50, 0, 7, 0, 0),
        (50, 120, 13, 0, 0),
        (300, 0, 0, 0, 0),
        (128, 0, 64, 400, 0),
        (10, 25, 3, 200, 0),
        (1000, 299, 0, 0, 0),
        (1000, 0, 0, 0, 40),
        (0, 0, 0, 100, 0),
    ];
    for &(batch, limit, per_next, max_resp, msb) in cases {
        let store = TestStore { data: data.clone(), per_next, max_scan_batch: msb, ..Default::default() };
        let mut d = ready(store, max_resp);
        let cap = if max_resp == 0 { DEFAULT_MAX_RESPONSE } else { max_resp as usize };
        let eff_batch = if msb > 0 && (batch == 0 || batch > msb) { msb } else { batch };
        let got = run_scan(&mut d, &scan_open(b"k", b"", false, limit, batch), eff_batch, cap);
        let want = if limit > 0 { &everything[..limit as usize] } else { &everything[..] };
        assert_eq!(got.len(), want.len(), "case {:?}", (batch, limit, per_next, max_resp, msb));
        assert!(got == want, "case {:?}: pairs differ", (batch, limit, per_next, max_resp, msb));
        assert_eq!(d.open_scans(), 0, "scan still tracked after its last batch");
        assert_eq!(d.store().scans_closed, d.store().scans_opened, "scan not released exactly once");
        assert_eq!(d.store().last_limit, limit);
    }
}

#[test]
fn reverse_and_bounded_scans() {
    let data = numbered(50);
    let mut d = ready(TestStore { data: data.clone(), ..Default::default() }, 0);
    let got = run_scan(&mut d, &scan_open(b"k0010", b"k0020", true, 0, 3), 3, DEFAULT_MAX_RESPONSE);
    let want: Vec<Kv> = data.range(b"k0010".to_vec()..b"k0020".to_vec()).rev().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_eq!(got, want);
    // An empty range is answered without the store.
    let before = d.store().store_calls;
    let resp = d.dispatch(3, &scan_open(b"b", b"a", false, 0, 0)).to_vec();
    assert_eq!(decode(Opcode::ScanOpen, &resp), Response::ScanOpened { id: 0, pairs: vec![], more: false });
    let resp = d.dispatch(3, &scan_open(b"a", b"a", false, 0, 0)).to_vec();
    assert_eq!(decode(Opcode::ScanOpen, &resp), Response::ScanOpened { id: 0, pairs: vec![], more: false });
    assert_eq!(d.store().store_calls, before);
}

#[test]
fn scan_ids_close_and_release() {
    let mut d = ready(TestStore { data: numbered(10), ..Default::default() }, 0);
    let resp = d.dispatch(3, &scan_open(b"", b"", false, 0, 2)).to_vec();
    let id = match decode(Opcode::ScanOpen, &resp) {
        Response::ScanOpened { id, pairs, more: true } if pairs.len() == 2 => id,
        other => panic!("{other:?}"),
    };
    assert_eq!(d.open_scans(), 1);
    let unknown = enc(|b| ScanNextRequest { header: Header::default(), id: id + 100, batch_size: 0 }.encode(b));
    assert_eq!(error_of(Opcode::ScanNext, d.dispatch(4, &unknown)).0, Status::Invalid);
    let close = |id| enc(|b| ScanCloseRequest { header: Header::default(), id }.encode(b));
    assert_eq!(decode(Opcode::ScanClose, d.dispatch(5, &close(id + 100))), Response::Ok);
    assert_eq!(d.open_scans(), 1);
    assert_eq!(decode(Opcode::ScanClose, d.dispatch(5, &close(id))), Response::Ok);
    assert_eq!(d.open_scans(), 0);
    assert_eq!(d.store().scans_closed, 1);
    assert_eq!(decode(Opcode::ScanClose, d.dispatch(5, &close(id))), Response::Ok, "idempotent");
    assert_eq!(d.store().scans_closed, 1);
    // CLOSE releases scans still open.
    d.dispatch(3, &scan_open(b"", b"", false, 0, 1));
    d.dispatch(3, &scan_open(b"", b"", true, 0, 1));
    assert_eq!(d.open_scans(), 2);
    assert_eq!(decode(Opcode::Close, d.dispatch(8, &[0])), Response::Ok);
    assert_eq!(d.open_scans(), 0);
    assert_eq!(d.store().scans_closed, d.store().scans_opened);
}

#[test]
fn a_pair_larger_than_max_response_fails_the_scan() {
    let mut store = TestStore::default();
    store.data.insert(b"a".to_vec(), vec![1; 10]);
    store.data.insert(b"b".to_vec(), vec![2; 1000]);
    let mut d = ready(store, 200);
    let resp = d.dispatch(3, &scan_open(b"", b"", false, 0, 0)).to_vec();
    let id = match decode(Opcode::ScanOpen, &resp) {
        Response::ScanOpened { id, pairs, more: true } if pairs.len() == 1 => id,
        other => panic!("{other:?}"),
    };
    let next = enc(|b| ScanNextRequest { header: Header::default(), id, batch_size: 0 }.encode(b));
    let (st, msg) = error_of(Opcode::ScanNext, d.dispatch(4, &next));
    assert_eq!(st, Status::Internal);
    assert!(msg.contains("1001 bytes"), "{msg}");
    assert_eq!(d.open_scans(), 0);
    assert_eq!(d.store().scans_closed, 1);
}

#[test]
fn partitions_from_cuts() {
    let preq = |start: &[u8], end: &[u8], max_parts| {
        enc(|b| PartitionsRequest { header: Header::default(), start, end, max_parts }.encode(b))
    };
    let store = TestStore { partitions: true, cuts: vec![b"m".to_vec(), b"t".to_vec()], ..Default::default() };
    let mut d = ready(store, 0);
    let resp = d.dispatch(7, &preq(b"", b"", 0)).to_vec();
    assert_eq!(
        decode(Opcode::Partitions, &resp),
        Response::Partitions(vec![
            crate::messages::Range { start: b"", end: b"m" },
            crate::messages::Range { start: b"m", end: b"t" },
            crate::messages::Range { start: b"t", end: b"" },
        ])
    );
    // Cuts outside the range, or too many, are the store's bug: INTERNAL.
    for (start, end, max) in [(&b"m"[..], &b""[..], 0), (&b""[..], &b"t"[..], 0), (&b""[..], &b""[..], 2)] {
        let resp = d.dispatch(7, &preq(start, end, max)).to_vec();
        assert_eq!(error_of(Opcode::Partitions, &resp).0, Status::Internal, "{start:?} {end:?} {max}");
    }
    d.store_mut().cuts = vec![b"t".to_vec(), b"m".to_vec()];
    assert_eq!(error_of(Opcode::Partitions, d.dispatch(7, &preq(b"", b"", 0))).0, Status::Internal);
    d.store_mut().cuts = vec![];
    let resp = d.dispatch(7, &preq(b"a", b"z", 1)).to_vec();
    assert_eq!(decode(Opcode::Partitions, &resp), Response::Partitions(vec![crate::messages::Range { start: b"a", end: b"z" }]));
}

#[test]
fn runtime_buffer_and_lengths() {
    let mut rt = Runtime::new(TestStore::default());
    assert!(rt.buffer(-1).is_none());
    let n = rt.buffer(10).map(|b| b.len()).unwrap_or(0);
    assert!(n >= 10, "buffer of {n} bytes");
    let big = rt.buffer(1 << 20).map(|b| b.len()).unwrap_or(0);
    assert!(big >= 1 << 20);
    let req = init_req(0);
    if let Some(b) = rt.buffer(req.len() as i32) {
        b[..req.len()].copy_from_slice(&req);
    }
    assert!(matches!(Response::decode(Opcode::Init, rt.dispatch(1, req.len() as i32)), Ok(Response::Manifest(_))));
    assert_eq!(error_of(Opcode::Get, rt.dispatch(2, -1)).0, Status::Invalid);
    assert_eq!(error_of(Opcode::Get, rt.dispatch(2, i32::MAX)).0, Status::Invalid);
}

#[test]
fn show_key_escapes() {
    assert_eq!(show_key(b"a\x00\"\xff"), "\"a\\x00\\\"\\xff\"");
    assert!(show_key(&[b'x'; 100]).ends_with("\"..."));
}

/// Random bytes and mutated valid requests, for every op code: the
/// dispatcher never panics, and every response decodes as a response to its
/// op (what the host checks), with a status the op allows.
#[test]
fn garbage_gets_well_formed_answers() {
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let valid: Vec<(i32, Vec<u8>)> = vec![
        (2, get(b"k0001")),
        (3, scan_open(b"k", b"", false, 5, 2)),
        (4, enc(|b| ScanNextRequest { header: Header::default(), id: 1, batch_size: 1 }.encode(b))),
        (5, enc(|b| ScanCloseRequest { header: Header::default(), id: 1 }.encode(b))),
        (6, commit(&[put(b"k0001", b"v"), put(b"k0002", b"w")])),
        (7, enc(|b| PartitionsRequest { header: Header::default(), start: b"", end: b"z", max_parts: 3 }.encode(b))),
        (9, vec![0]),
        (10, vec![0]),
        (11, vec![0]),
    ];
    let store = TestStore {
        data: numbered(20),
        partitions: true,
        cuts: vec![b"m".to_vec()],
        size: Some(Ok(1 << 40)),
        reclaim: Some(Ok(())),
        ..Default::default()
    };
    let mut d = ready(store, 300);
    for i in 0..20_000 {
        let (op, req) = if i % 2 == 0 {
            let (op, mut req) = valid[rnd() as usize % valid.len()].clone();
            for _ in 0..1 + rnd() % 3 {
                match rnd() % 3 {
                    0 if !req.is_empty() => {
                        let at = rnd() as usize % req.len();
                        req[at] = rnd() as u8;
                    }
                    1 => req.truncate(rnd() as usize % (req.len() + 1)),
                    _ => req.push(rnd() as u8),
                }
            }
            (op, req)
        } else {
            let n = rnd() as usize % 24;
            ((rnd() % 14) as i32 - 1, (0..n).map(|_| rnd() as u8).collect())
        };
        let resp = d.dispatch(op, &req).to_vec();
        match Opcode::from_code(op) {
            Some(o) => {
                if let Err(e) = Response::decode(o, &resp) {
                    panic!("op {op}, request {req:02x?}: response {resp:02x?} does not decode: {e}");
                }
            }
            None => assert_eq!(resp.first(), Some(&Status::Unsupported.code()), "unknown op {op}"),
        }
        assert!(resp.len() <= 300, "response of {} bytes", resp.len());
    }
    assert_eq!(d.store().scans_opened, d.store().scans_closed + d.open_scans());
}
