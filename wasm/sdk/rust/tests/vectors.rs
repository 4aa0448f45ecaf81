//! The ABI's golden vectors (`wasm/abi/testdata/vectors.json`, shared with the Go
//! and C implementations) against the Rust codec and dispatcher: every
//! vector decodes with the decoder of its op and direction, re-encodes to
//! the same bytes and holds the values its note describes; malformed
//! variants of every vector are rejected; and the dispatcher answers golden
//! requests with golden responses.
//!
//! The file is embedded at compile time, so the test binary needs no
//! working directory, and parsed with a small JSON reader below (std only).

use engram_plugin::abi::{Model, OpKind, Opcode, Status};
use engram_plugin::codec::DecodeError;
use engram_plugin::messages::{Header, Pair, Range, Request, Response, ScanOpenRequest};
use engram_plugin::{BatchWriter, Ctx, Dispatcher, Error, HostInfo, Manifest, Op, Progress, ScanOptions, Store};

const VECTORS: &str = include_str!("../../../abi/testdata/vectors.json");

/// A minimal JSON reader: enough for the vectors file, strict enough to
/// notice a broken one.
mod json {
    #[derive(Debug, PartialEq)]
    pub enum Value {
        Null,
        Bool(bool),
        Number(f64),
        String(String),
        Array(Vec<Value>),
        Object(Vec<(String, Value)>),
    }

    impl Value {
        pub fn get(&self, key: &str) -> Option<&Value> {
            match self {
                Value::Object(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
                _ => None,
            }
        }

        pub fn as_str(&self) -> Option<&str> {
            match self {
                Value::String(s) => Some(s),
                _ => None,
            }
        }
    }

    pub fn parse(text: &str) -> Result<Value, String> {
        let mut p = Parser { b: text.as_bytes(), i: 0 };
        let v = p.value()?;
        p.ws();
        if p.i != p.b.len() {
            return Err(p.err("trailing characters"));
        }
        Ok(v)
    }

    struct Parser<'a> {
        b: &'a [u8],
        i: usize,
    }

    impl Parser<'_> {
        fn err(&self, what: &str) -> String {
            format!("JSON: {} at byte {}", what, self.i)
        }

        fn ws(&mut self) {
            while matches!(self.b.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
                self.i += 1;
            }
        }

        fn eat(&mut self, c: u8) -> Result<(), String> {
            self.ws();
            if self.b.get(self.i) == Some(&c) {
                self.i += 1;
                Ok(())
            } else {
                Err(self.err(&format!("expected {:?}", c as char)))
            }
        }

        fn literal(&mut self, word: &str, v: Value) -> Result<Value, String> {
            if self.b[self.i..].starts_with(word.as_bytes()) {
                self.i += word.len();
                Ok(v)
            } else {
                Err(self.err("bad literal"))
            }
        }

        fn value(&mut self) -> Result<Value, String> {
            self.ws();
            match self.b.get(self.i) {
                Some(b'{') => self.object(),
                Some(b'[') => self.array(),
                Some(b'"') => self.string().map(Value::String),
                Some(b't') => self.literal("true", Value::Bool(true)),
                Some(b'f') => self.literal("false", Value::Bool(false)),
                Some(b'n') => self.literal("null", Value::Null),
                Some(b'-' | b'0'..=b'9') => self.number(),
                _ => Err(self.err("expected a value")),
            }
        }

        fn object(&mut self) -> Result<Value, String> {
            self.eat(b'{')?;
            let mut fields = Vec::new();
            self.ws();
            if self.b.get(self.i) == Some(&b'}') {
                self.i += 1;
                return Ok(Value::Object(fields));
            }
            loop {
                self.ws();
                let k = self.string()?;
                self.eat(b':')?;
                fields.push((k, self.value()?));
                self.ws();
                match self.b.get(self.i) {
                    Some(b',') => self.i += 1,
                    Some(b'}') => {
                        self.i += 1;
                        return Ok(Value::Object(fields));
                    }
                    _ => return Err(self.err("expected ',' or '}'")),
                }
            }
        }

        fn array(&mut self) -> Result<Value, String> {
            self.eat(b'[')?;
            let mut items = Vec::new();
            self.ws();
            if self.b.get(self.i) == Some(&b']') {
                self.i += 1;
                return Ok(Value::Array(items));
            }
            loop {
                items.push(self.value()?);
                self.ws();
                match self.b.get(self.i) {
                    Some(b',') => self.i += 1,
                    Some(b']') => {
                        self.i += 1;
                        return Ok(Value::Array(items));
                    }
                    _ => return Err(self.err("expected ',' or ']'")),
                }
            }
        }

        fn number(&mut self) -> Result<Value, String> {
            let start = self.i;
            while matches!(self.b.get(self.i), Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')) {
                self.i += 1;
            }
            let s = std::str::from_utf8(&self.b[start..self.i]).map_err(|_| self.err("bad number"))?;
            s.parse().map(Value::Number).map_err(|_| self.err("bad number"))
        }

        fn hex4(&mut self) -> Result<u32, String> {
            let h = self.b.get(self.i..self.i + 4).ok_or_else(|| self.err("short \\u escape"))?;
            let s = std::str::from_utf8(h).map_err(|_| self.err("bad \\u escape"))?;
            let v = u32::from_str_radix(s, 16).map_err(|_| self.err("bad \\u escape"))?;
            self.i += 4;
            Ok(v)
        }

        fn string(&mut self) -> Result<String, String> {
            self.eat(b'"')?;
            let mut out = Vec::new();
            loop {
                let c = *self.b.get(self.i).ok_or_else(|| self.err("unterminated string"))?;
                self.i += 1;
                match c {
                    b'"' => return String::from_utf8(out).map_err(|_| self.err("invalid UTF-8")),
                    b'\\' => {
                        let e = *self.b.get(self.i).ok_or_else(|| self.err("unterminated escape"))?;
                        self.i += 1;
                        let ch = match e {
                            b'"' => '"',
                            b'\\' => '\\',
                            b'/' => '/',
                            b'b' => '\u{8}',
                            b'f' => '\u{c}',
                            b'n' => '\n',
                            b'r' => '\r',
                            b't' => '\t',
                            b'u' => {
                                let mut cp = self.hex4()?;
                                if (0xd800..0xdc00).contains(&cp) && self.b[self.i..].starts_with(b"\\u") {
                                    self.i += 2;
                                    let lo = self.hex4()?;
                                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo.wrapping_sub(0xdc00) & 0x3ff);
                                }
                                char::from_u32(cp).ok_or_else(|| self.err("bad code point"))?
                            }
                            _ => return Err(self.err("bad escape")),
                        };
                        let mut buf = [0; 4];
                        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                    }
                    c if c < 0x20 => return Err(self.err("control character in string")),
                    c => out.push(c),
                }
            }
        }
    }
}

#[test]
fn json_reader() {
    use json::Value;
    let v = json::parse(r#" [ {"a": "x\"\\\/\n\u00e9\ud83d\ude00", "b": [1, -2.5e1, true, false, null], "c": {}} ] "#).unwrap();
    let obj = match &v {
        Value::Array(items) => &items[0],
        other => panic!("{other:?}"),
    };
    assert_eq!(obj.get("a").and_then(Value::as_str), Some("x\"\\/\né😀"));
    assert_eq!(
        obj.get("b"),
        Some(&Value::Array(vec![Value::Number(1.0), Value::Number(-25.0), Value::Bool(true), Value::Bool(false), Value::Null]))
    );
    assert_eq!(obj.get("c"), Some(&Value::Object(vec![])));
    for bad in ["[1,]", "{\"a\" 1}", "\"abc", "[1] x", "{\"a\":\"\\q\"}", ""] {
        assert!(json::parse(bad).is_err(), "{bad:?} parsed");
    }
}

struct Vector {
    name: String,
    op: Opcode,
    request: bool,
    bytes: Vec<u8>,
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length: {s}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or_else(|_| panic!("bad hex: {s}")))
        .collect()
}

fn vectors() -> Vec<Vector> {
    let doc = json::parse(VECTORS).unwrap_or_else(|e| panic!("vectors.json: {e}"));
    let items = match doc {
        json::Value::Array(items) => items,
        other => panic!("vectors.json is not an array: {other:?}"),
    };
    items
        .iter()
        .map(|v| {
            let field = |k: &str| v.get(k).and_then(json::Value::as_str).unwrap_or_else(|| panic!("vector without {k}"));
            let name = field("name").to_string();
            let op = Opcode::from_name(field("op")).unwrap_or_else(|| panic!("{name}: unknown op {}", field("op")));
            let request = match field("direction") {
                "request" => true,
                "response" => false,
                d => panic!("{name}: unknown direction {d}"),
            };
            assert!(!field("note").is_empty(), "{name}: no note");
            Vector { name, op, request, bytes: unhex(field("hex")) }
        })
        .collect()
}

#[derive(Debug, PartialEq)]
enum Msg<'a> {
    Req(Request<'a>),
    Resp(Response<'a>),
}

fn decode<'a>(v: &Vector, b: &'a [u8]) -> Result<Msg<'a>, DecodeError> {
    if v.request {
        Request::decode(v.op, b).map(Msg::Req)
    } else {
        Response::decode(v.op, b).map(Msg::Resp)
    }
}

fn encode(m: &Msg<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    match m {
        Msg::Req(r) => r.encode(&mut out),
        Msg::Resp(r) => r.encode(&mut out),
    }
    out
}

/// The INIT request and the manifest may gain trailing fields; every other
/// message is fixed-layout.
fn extensible(v: &Vector) -> bool {
    v.op == Opcode::Init
}

const NAMES: [&str; 22] = [
    "init-request",
    "get-request",
    "scan-open-request",
    "scan-next-request",
    "scan-close-request",
    "commit-request",
    "partitions-request",
    "close-request",
    "size-request",
    "reclaim-request",
    "init-response",
    "init-response-abi-1.1",
    "get-response-ok",
    "get-response-not-found",
    "scan-open-response",
    "scan-next-response-last",
    "commit-response-conflict",
    "commit-response-uncertain",
    "partitions-response",
    "size-response",
    "reclaim-response-ok",
    "reclaim-response-deadline",
];

#[test]
fn every_vector_round_trips() {
    let vs = vectors();
    for name in NAMES {
        assert!(vs.iter().any(|v| v.name == name), "vector {name} missing from vectors.json");
    }
    for v in &vs {
        let m = decode(v, &v.bytes).unwrap_or_else(|e| panic!("{}: decode: {}", v.name, e));
        assert_eq!(encode(&m), v.bytes, "{}: re-encoding differs", v.name);
    }
}

/// The decoded values are those the notes describe (a decoder and an
/// encoder that swapped two fields the same way would round-trip).
#[test]
fn values_match_the_notes() {
    for v in &vectors() {
        let m = decode(v, &v.bytes).unwrap_or_else(|e| panic!("{}: {}", v.name, e));
        let h0 = Header { deadline: 0 };
        match (v.name.as_str(), m) {
            ("init-request", Msg::Req(Request::Init(r))) => {
                assert_eq!(r.header.deadline, 1_700_000_000_000_000_000);
                assert_eq!((r.config, r.host_flags, r.instance, r.max_response), (&b"dsn=x"[..], 1, 2, 64 << 20));
                assert!(r.net_allowed());
            }
            ("get-request", Msg::Req(Request::Get(r))) => assert_eq!((r.header, r.key), (h0, &b"a\x00\xff"[..])),
            ("scan-open-request", Msg::Req(Request::ScanOpen(r))) => assert_eq!(
                r,
                ScanOpenRequest { header: Header { deadline: 1 }, start: b"a", end: b"b", reverse: true, limit: 300, batch_size: 128 }
            ),
            ("scan-next-request", Msg::Req(Request::ScanNext(r))) => assert_eq!((r.header, r.id, r.batch_size), (h0, 7, 0)),
            ("scan-close-request", Msg::Req(Request::ScanClose(r))) => assert_eq!((r.header, r.id), (h0, 200)),
            ("commit-request", Msg::Req(Request::Commit(r))) => {
                let op = |kind, key, value, expected| Op { kind, key, value, expected };
                assert_eq!(r.header, h0);
                assert_eq!(
                    r.ops,
                    vec![
                        op(OpKind::Put, &b"k1"[..], &b"v1"[..], &b""[..]),
                        op(OpKind::Delete, b"k2", b"", b""),
                        op(OpKind::PutIfAbsent, b"k3", b"", b""),
                        op(OpKind::CompareAndSwap, b"k4", b"n", b"o"),
                        op(OpKind::CompareAndDelete, b"k5", b"", b"o"),
                    ]
                );
            }
            ("partitions-request", Msg::Req(Request::Partitions(r))) => {
                assert_eq!((r.header, r.start, r.end, r.max_parts), (h0, &b""[..], &b"z"[..], 4))
            }
            ("close-request", Msg::Req(Request::Close(r))) => assert_eq!(r.header, h0),
            ("size-request", Msg::Req(Request::Size(r))) => assert_eq!(r.header.deadline, 1_700_000_000_000_000_000),
            ("reclaim-request", Msg::Req(Request::Reclaim(r))) => {
                assert_eq!(r.header.deadline, 1_700_000_000_000_000_000)
            }
            ("init-response", Msg::Resp(Response::Manifest(m))) => {
                assert_eq!((m.name, m.version, m.abi_minor), (&b"memkv"[..], &b"1.0"[..], 0));
                assert_eq!(m.model(), Some(Model::Single));
                assert_eq!((m.max_instances, m.ops, m.features), (1, 0x3fe, 1));
                assert_eq!((m.max_commit_ops, m.max_commit_bytes, m.max_scan_batch), (0, 0, 1000));
            }
            ("init-response-abi-1.1", Msg::Resp(Response::Manifest(m))) => {
                assert_eq!((m.name, m.version, m.abi_minor), (&b"memkv"[..], &b"1.1"[..], 1));
                assert_eq!(m.model(), Some(Model::Single));
                assert_eq!((m.max_instances, m.ops, m.features), (1, 0xffe, 1));
                assert_eq!(m.ops & (Opcode::Size.bit() | Opcode::Reclaim.bit()), 0xc00);
                assert_eq!((m.max_commit_ops, m.max_commit_bytes, m.max_scan_batch), (0, 0, 1000));
            }
            ("get-response-ok", Msg::Resp(r)) => assert_eq!(r, Response::Value(b"hello")),
            ("get-response-not-found", Msg::Resp(r)) => assert_eq!(r, Response::NotFound),
            ("scan-open-response", Msg::Resp(r)) => assert_eq!(
                r,
                Response::ScanOpened {
                    id: 1,
                    pairs: vec![Pair { key: b"a", value: b"1" }, Pair { key: b"b", value: b"" }],
                    more: true
                }
            ),
            ("scan-next-response-last", Msg::Resp(r)) => assert_eq!(r, Response::Batch { pairs: vec![], more: false }),
            ("commit-response-conflict", Msg::Resp(r)) => {
                assert_eq!(r, Response::Conflict { index: 3, exists: true, current: b"cur" })
            }
            ("commit-response-uncertain", Msg::Resp(r)) => {
                assert_eq!(r, Response::Error { status: Status::Uncertain, message: b"timeout" })
            }
            ("partitions-response", Msg::Resp(r)) => assert_eq!(
                r,
                Response::Partitions(vec![Range { start: b"", end: b"m" }, Range { start: b"m", end: b"" }])
            ),
            ("size-response", Msg::Resp(r)) => assert_eq!(r, Response::Size(5 << 30)),
            ("reclaim-response-ok", Msg::Resp(r)) => assert_eq!(r, Response::Ok),
            ("reclaim-response-deadline", Msg::Resp(r)) => assert_eq!(
                r,
                Response::Error { status: Status::Deadline, message: b"vacuum ran past the deadline" }
            ),
            (name, m) if NAMES.contains(&name) => panic!("{name}: decoded as {m:?}"),
            // A vector added after this test: round-tripping covers it.
            _ => {}
        }
    }
}

#[test]
fn every_truncation_is_rejected() {
    for v in &vectors() {
        for n in 0..v.bytes.len() {
            assert!(decode(v, &v.bytes[..n]).is_err(), "{}: the first {} of {} bytes decoded", v.name, n, v.bytes.len());
        }
    }
}

#[test]
fn trailing_bytes() {
    for v in &vectors() {
        let mut b = v.bytes.clone();
        b.push(0);
        if extensible(v) {
            // A later minor's field: ignored, the known fields unchanged.
            let with = decode(v, &b).unwrap_or_else(|e| panic!("{}: trailing field refused: {}", v.name, e));
            assert_eq!(with, decode(v, &v.bytes).unwrap(), "{}", v.name);
        } else {
            assert_eq!(decode(v, &b).err(), Some(DecodeError::Trailing), "{}: trailing byte accepted", v.name);
        }
    }
}

#[test]
fn non_shortest_varints_are_rejected() {
    let mut checked = 0;
    for v in &vectors() {
        // The first field is a varint: a request's deadline, or the first
        // body field of a response (a length, an id, a count, an index).
        let at = if v.request { 0 } else { 1 };
        let end = match v.bytes.iter().skip(at).position(|&c| c < 0x80) {
            Some(i) => at + i,
            None => continue, // NOT_FOUND: no body
        };
        if end - at + 1 >= 10 {
            continue;
        }
        // Same value, one more byte: the last group gains a continuation
        // bit and a zero group follows.
        let mut b = v.bytes[..end].to_vec();
        b.push(v.bytes[end] | 0x80);
        b.push(0);
        b.extend_from_slice(&v.bytes[end + 1..]);
        assert_eq!(decode(v, &b).err(), Some(DecodeError::NonMinimal), "{}: {:02x?} accepted", v.name, b);
        checked += 1;
    }
    assert!(checked >= 14, "only {checked} vectors have a leading varint");
}

#[test]
fn counts_beyond_the_message_are_rejected() {
    // Where each vector's element count sits.
    let counts = [("commit-request", 1), ("scan-open-response", 2), ("scan-next-response-last", 1), ("partitions-response", 1)];
    let vs = vectors();
    for (name, at) in counts {
        let v = vs.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("{name} missing"));
        let rest = v.bytes.len() - at - 1;
        // One more element than the remaining bytes could hold at two
        // bytes each, still a one-byte varint.
        let n = rest / 2 + 1;
        assert!(n < 0x80);
        let mut b = v.bytes.clone();
        b[at] = n as u8;
        assert_eq!(decode(v, &b).err(), Some(DecodeError::Count), "{name}: count {n} over {rest} bytes accepted");
        // A count of 2^64-1.
        let mut b = v.bytes[..at].to_vec();
        b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        b.extend_from_slice(&v.bytes[at + 1..]);
        assert_eq!(decode(v, &b).err(), Some(DecodeError::Count), "{name}: a huge count accepted");
    }
}

/// A store answering like the golden responses.
struct Golden {
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    config: Vec<u8>,
    last_key: Vec<u8>,
    commit_error: Option<Error>,
    reclaim_error: Option<Error>,
    /// The deadlines SIZE and RECLAIM saw.
    deadlines: Vec<Option<i64>>,
}

impl Store for Golden {
    type Scan = usize;

    fn init(&mut self, _: &Ctx, config: &[u8], host: &HostInfo) -> Result<Manifest, Error> {
        self.config = config.to_vec();
        assert_eq!((host.instance, host.net_allowed, host.max_response), (2, true, 64 << 20));
        let mut m = Manifest::new("memkv", "1.1", Model::Single);
        m.partitions = true;
        m.size = true;
        m.reclaim = true;
        m.max_scan_batch = 1000;
        Ok(m)
    }

    fn size(&mut self, cx: &Ctx) -> Result<u64, Error> {
        self.deadlines.push(cx.deadline());
        Ok(5 << 30)
    }

    fn reclaim(&mut self, cx: &Ctx) -> Result<(), Error> {
        self.deadlines.push(cx.deadline());
        self.reclaim_error.clone().map_or(Ok(()), Err)
    }

    fn get(&mut self, _: &Ctx, key: &[u8]) -> Result<&[u8], Error> {
        self.last_key = key.to_vec();
        if key == b"missing" {
            return Err(Error::NotFound);
        }
        Ok(b"hello")
    }

    fn scan(&mut self, _: &Ctx, _: &ScanOptions<'_>) -> Result<usize, Error> {
        Ok(0)
    }

    /// Pushes what fits and answers More even at the end, as an engine that
    /// cannot tell would: the next batch is empty and final.
    fn scan_next(&mut self, _: &Ctx, pos: &mut usize, out: &mut BatchWriter<'_>) -> Result<Progress, Error> {
        if *pos == self.pairs.len() {
            return Ok(Progress::Done);
        }
        while let Some((k, v)) = self.pairs.get(*pos) {
            if !out.push(k, v) {
                break;
            }
            *pos += 1;
        }
        Ok(Progress::More)
    }

    fn commit(&mut self, _: &Ctx, _: &[Op<'_>]) -> Result<(), Error> {
        Err(self.commit_error.clone().unwrap_or(Error::Internal("no error set".into())))
    }

    fn close(&mut self, _: &Ctx) -> Result<(), Error> {
        Ok(())
    }
}

#[test]
fn dispatcher_answers_golden_requests() {
    let vs = vectors();
    let vec = |name: &str| vs.iter().find(|v| v.name == name).unwrap_or_else(|| panic!("{name} missing")).bytes.clone();
    let store = Golden {
        pairs: vec![(b"a".to_vec(), b"1".to_vec()), (b"b".to_vec(), b"".to_vec())],
        config: vec![],
        last_key: vec![],
        commit_error: Some(Error::Conflict { index: 3, exists: true, current: b"cur".to_vec() }),
        reclaim_error: None,
        deadlines: vec![],
    };
    let mut d = Dispatcher::new(store);
    // INIT: the golden 1.1 manifest is memkv's, which this store mimics
    // (ops INIT..RECLAIM, partitions, max_scan_batch 1000).
    assert_eq!(d.dispatch(1, &vec("init-request")), vec("init-response-abi-1.1"));
    assert_eq!(d.store().config, b"dsn=x");
    assert_eq!(d.dispatch(2, &vec("get-request")), vec("get-response-ok"));
    assert_eq!(d.store().last_key, b"a\x00\xff");
    assert_eq!(d.dispatch(6, &vec("commit-request")), vec("commit-response-conflict"));
    d.store_mut().commit_error = Some(Error::Uncertain("timeout".into()));
    assert_eq!(d.dispatch(6, &vec("commit-request")), vec("commit-response-uncertain"));
    // A forward scan of the two pairs in a batch of two: the first scan's
    // id is 1, and the engine cannot tell the scan ended.
    let mut open = Vec::new();
    Request::ScanOpen(ScanOpenRequest { batch_size: 2, ..Default::default() }).encode(&mut open);
    assert_eq!(d.dispatch(3, &open), vec("scan-open-response"));
    assert_eq!(d.dispatch(4, &[0, 1, 0]), vec("scan-next-response-last"));
    assert_eq!(d.open_scans(), 0);
    assert_eq!(d.dispatch(5, &vec("scan-close-request")), [0], "SCAN_CLOSE of an unknown id");
    assert_eq!(d.dispatch(10, &vec("size-request")), vec("size-response"));
    assert_eq!(d.dispatch(11, &vec("reclaim-request")), vec("reclaim-response-ok"));
    d.store_mut().reclaim_error = Some(Error::Deadline("vacuum ran past the deadline".into()));
    assert_eq!(d.dispatch(11, &vec("reclaim-request")), vec("reclaim-response-deadline"));
    assert_eq!(d.store().deadlines, vec![Some(1_700_000_000_000_000_000); 3]);
    assert_eq!(d.dispatch(8, &vec("close-request")), [0]);
}
