/*
 * dispatch_test.c - drives the example plugin (examples/memkv) natively
 * through the SDK's dispatcher with encoded requests, as the host would.
 *
 * It checks what `engram plugin verify` cannot see from outside or only
 * sees in wasm, where a stray write corrupts memory silently: the SDK's
 * own answers (INIT rules, malformed requests, duplicate and empty keys,
 * unknown ops and scan ids, CLOSE), batches split to stay under a tiny
 * max_response, SIZE and RECLAIM (declared only with their callbacks, the
 * statuses they may answer, memkv's byte count), and a randomized model
 * check of memkv's snapshots: scans held open across commits must return
 * exactly the state they opened on, while IDLE, RECLAIM and scan closes
 * collect old versions, and SIZE counts exactly the live keys and values
 * whenever no scan holds old ones. Built with the sanitizers, it also
 * catches out-of-bounds accesses and leaks in both.
 *
 * It prints `dispatch: N checks passed, M failed` and exits non-zero on
 * any failure.
 */
#include "engram_plugin.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks, failures;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        checks++;                                                             \
        if (!(cond)) {                                                        \
            failures++;                                                       \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                       \
            printf(__VA_ARGS__);                                              \
            printf("\n");                                                     \
        }                                                                     \
    } while (0)

static engram_instance *in;
static engram_buf req;

static engram_bytes B(const char *s) { return (engram_bytes){(const uint8_t *)s, strlen(s)}; }

/* Sends the request in req as op; returns the response (valid until the
 * next send) after checking the framing the host checks. */
static engram_bytes dispatch(int op) {
    uint8_t *b = engram_instance_buffer(in, req.len);
    if (!b) {
        printf("out of memory\n");
        exit(2);
    }
    if (req.len) memcpy(b, req.ptr, req.len);
    engram_bytes r = engram_instance_dispatch(in, (uint32_t)op, req.len);
    req.len = 0;
    int st;
    const uint8_t *body;
    size_t bn;
    CHECK(engram_split_response(r.ptr, r.len, &st, &body, &bn) == ENGRAM_E_OK && engram_status_allowed(op, st),
          "%s: response status %d is not allowed", engram_op_name(op), r.len ? r.ptr[0] : -1);
    return r;
}

/* The message of an error response, NUL-terminated in a static buffer. */
static const char *message(engram_bytes r) {
    static char buf[1200];
    engram_bytes m = {NULL, 0};
    if (r.len < 1 || engram_decode_message(r.ptr + 1, r.len - 1, &m) != ENGRAM_E_OK) return "(no message)";
    snprintf(buf, sizeof buf, "%.*s", (int)m.len, (const char *)m.ptr);
    return buf;
}

static int init(const char *config, uint32_t max_resp) {
    engram_init_req m = {0, B(config), 0, 0, max_resp};
    engram_encode_init_req(&req, &m);
    return dispatch(ENGRAM_OP_INIT).ptr[0];
}

static int commit(const engram_op *ops, size_t n) {
    engram_commit_req m = {0, (engram_op *)ops, n};
    engram_encode_commit_req(&req, &m);
    return dispatch(ENGRAM_OP_COMMIT).ptr[0];
}

static int put(const char *k, const char *v) {
    engram_op op = {ENGRAM_PUT, B(k), B(v), {NULL, 0}};
    return commit(&op, 1);
}

/* GET; the value goes to out (NUL-terminated) when found. */
static int get(const char *k, char *out, size_t cap) {
    engram_get_req m = {0, B(k)};
    engram_encode_get_req(&req, &m);
    engram_bytes r = dispatch(ENGRAM_OP_GET);
    engram_bytes v;
    if (r.ptr[0] == ENGRAM_OK && engram_decode_value(r.ptr + 1, r.len - 1, &v) == ENGRAM_E_OK)
        snprintf(out, cap, "%.*s", (int)v.len, (const char *)v.ptr);
    return r.ptr[0];
}

/* A growing text of "key=value;" items, to compare scans with models. */
typedef struct text {
    char *s;
    size_t n, cap;
} text;

static void tadd(text *t, const uint8_t *p, size_t n) {
    if (t->n + n + 1 > t->cap) {
        t->cap = (t->n + n + 1) * 2;
        t->s = realloc(t->s, t->cap);
        if (!t->s) exit(2);
    }
    memcpy(t->s + t->n, p, n);
    t->n += n;
    t->s[t->n] = 0;
}

static void tpair(text *t, engram_bytes k, engram_bytes v) {
    tadd(t, k.ptr, k.len);
    tadd(t, (const uint8_t *)"=", 1);
    tadd(t, v.ptr, v.len);
    tadd(t, (const uint8_t *)";", 1);
}

/* Appends a batch response's pairs to t; returns its status, and the
 * scan's id, more flag and pair count through the pointers. */
static int batch(engram_bytes r, bool opened, uint64_t *id, bool *more, size_t *count, text *t) {
    static engram_pair pairs[4096];
    *more = false;
    *count = 0;
    if (r.ptr[0] != ENGRAM_OK) return r.ptr[0];
    engram_err e = opened ? engram_decode_scan_opened(r.ptr + 1, r.len - 1, id, pairs, 4096, count, more)
                          : engram_decode_batch(r.ptr + 1, r.len - 1, pairs, 4096, count, more);
    CHECK(e == ENGRAM_E_OK, "batch does not decode: %s", engram_err_str(e));
    for (size_t i = 0; i < *count; i++) tpair(t, pairs[i].key, pairs[i].value);
    return ENGRAM_OK;
}

static int scan_open(const char *start, const char *end, bool reverse, uint64_t limit, uint32_t bs, uint64_t *id,
                     bool *more, size_t *count, text *t) {
    engram_scan_open_req m = {0, B(start), B(end), reverse, limit, bs};
    engram_encode_scan_open_req(&req, &m);
    engram_bytes r = dispatch(ENGRAM_OP_SCAN_OPEN);
    return batch(r, true, id, more, count, t);
}

static int scan_next(uint64_t id, uint32_t bs, bool *more, size_t *count, text *t, size_t *resp_len) {
    engram_scan_next_req m = {0, id, bs};
    engram_encode_scan_next_req(&req, &m);
    engram_bytes r = dispatch(ENGRAM_OP_SCAN_NEXT);
    if (resp_len) *resp_len = r.len;
    uint64_t unused;
    return batch(r, false, &unused, more, count, t);
}

static void scan_close(uint64_t id) {
    engram_scan_close_req m = {0, id};
    engram_encode_scan_close_req(&req, &m);
    CHECK(dispatch(ENGRAM_OP_SCAN_CLOSE).ptr[0] == ENGRAM_OK, "SCAN_CLOSE %llu", (unsigned long long)id);
}

static int simple(int op) {
    engram_empty_req m = {0};
    engram_encode_empty_req(&req, &m);
    return dispatch(op).ptr[0];
}

/* SIZE: its status, and the byte count in *bytes when OK. */
static int size(int64_t *bytes) {
    engram_empty_req m = {0};
    engram_encode_empty_req(&req, &m);
    engram_bytes r = dispatch(ENGRAM_OP_SIZE);
    *bytes = -1;
    if (r.ptr[0] == ENGRAM_OK)
        CHECK(engram_decode_size(r.ptr + 1, r.len - 1, bytes) == ENGRAM_E_OK, "SIZE response does not decode");
    return r.ptr[0];
}

static void fresh(const char *config, uint32_t max_resp) {
    void *self = NULL;
    const engram_plugin *vt = engram_plugin_entry(&self);
    in = engram_instance_new(vt, self);
    if (!in) exit(2);
    CHECK(init(config, max_resp) == ENGRAM_OK, "INIT");
}

static void finish(void) {
    CHECK(simple(ENGRAM_OP_CLOSE) == ENGRAM_OK, "CLOSE");
    engram_instance_free(in);
    in = NULL;
}

/* ---- the SDK's own answers ---- */

static void test_protocol(void) {
    void *self = NULL;
    const engram_plugin *vt = engram_plugin_entry(&self);
    in = engram_instance_new(vt, self);
    char v[64];
    CHECK(get("a", v, sizeof v) == ENGRAM_INVALID, "GET before INIT");
    CHECK(init("not empty", 0) == ENGRAM_INVALID, "INIT with a config memkv refuses");
    CHECK(strstr(message(dispatch((engram_encode_init_req(&req, &(engram_init_req){0, B("x"), 0, 0, 0}), ENGRAM_OP_INIT))),
                 "no configuration") != NULL,
          "INIT's refusal carries the plugin's message");
    CHECK(init(" \n", 0) == ENGRAM_OK, "INIT with blank config");
    CHECK(init("", 0) == ENGRAM_INVALID, "INIT twice");

    /* Malformed requests: INVALID, never a crash. */
    static const uint8_t bad_get[] = {0x00, 0x05, 'a'};
    engram_buf_reserve(&req, sizeof bad_get);
    memcpy(req.ptr, bad_get, sizeof bad_get);
    req.len = sizeof bad_get;
    engram_bytes r = dispatch(ENGRAM_OP_GET);
    CHECK(r.ptr[0] == ENGRAM_INVALID && strstr(message(r), "malformed"), "truncated GET: %s", message(r));
    CHECK(get("", v, sizeof v) == ENGRAM_INVALID, "GET of an empty key");
    CHECK(simple(42) == ENGRAM_UNSUPPORTED, "unknown op");
    CHECK(simple(ENGRAM_OP_IDLE) == ENGRAM_OK, "IDLE");

    /* COMMIT's structural rules. */
    CHECK(commit(NULL, 0) == ENGRAM_OK, "empty COMMIT");
    engram_op dup[] = {{ENGRAM_PUT, B("k"), B("1"), {0}}, {ENGRAM_PUT, B("j"), B("2"), {0}},
                       {ENGRAM_DELETE, B("k"), {0}, {0}}};
    CHECK(commit(dup, 3) == ENGRAM_INVALID, "duplicate key");
    CHECK(get("k", v, sizeof v) == ENGRAM_NOT_FOUND, "a refused batch applied nothing");
    engram_op empty[] = {{ENGRAM_PUT, B("k"), B("1"), {0}}, {ENGRAM_PUT, B(""), B("2"), {0}}};
    CHECK(commit(empty, 2) == ENGRAM_INVALID, "empty key");
    engram_op many[300];
    char keys[300][16];
    for (int i = 0; i < 300; i++) {
        snprintf(keys[i], sizeof keys[i], "m%03d", i);
        many[i] = (engram_op){ENGRAM_PUT, B(keys[i]), B(keys[i]), {0}};
    }
    CHECK(commit(many, 300) == ENGRAM_OK, "300-op commit (grows the ops array and the duplicate finder)");
    many[299].key = B("m007");
    CHECK(commit(many, 300) == ENGRAM_INVALID, "duplicate at the end of a long batch");

    /* Conflicts name the lowest failing op and its current value. */
    engram_op conds[] = {{ENGRAM_PUT, B("x"), B("1"), {0}},
                         {ENGRAM_COMPARE_AND_SWAP, B("m001"), B("new"), B("wrong")},
                         {ENGRAM_PUT_IF_ABSENT, B("m002"), B("v"), {0}}};
    engram_commit_req cm = {0, conds, 3};
    engram_encode_commit_req(&req, &cm);
    r = dispatch(ENGRAM_OP_COMMIT);
    engram_conflict cf;
    CHECK(r.ptr[0] == ENGRAM_CONFLICT && engram_decode_conflict(r.ptr + 1, r.len - 1, &cf) == ENGRAM_E_OK &&
              cf.index == 1 && cf.exists && cf.current.len == 4 && !memcmp(cf.current.ptr, "m001", 4),
          "CONFLICT on op 1 with its value");
    CHECK(get("x", v, sizeof v) == ENGRAM_NOT_FOUND, "a conflicting batch applied nothing");
    engram_op cad[] = {{ENGRAM_COMPARE_AND_DELETE, B("absent"), {0}, B("")}};
    engram_commit_req cm2 = {0, cad, 1};
    engram_encode_commit_req(&req, &cm2);
    r = dispatch(ENGRAM_OP_COMMIT);
    CHECK(r.ptr[0] == ENGRAM_CONFLICT && engram_decode_conflict(r.ptr + 1, r.len - 1, &cf) == ENGRAM_E_OK &&
              cf.index == 0 && !cf.exists && cf.current.len == 0,
          "an absent key never matches, even an empty expected value");

    /* Scan ids: unknown ones are INVALID for SCAN_NEXT and OK for
     * SCAN_CLOSE; an exhausted scan's id is gone. */
    bool more;
    size_t count;
    text t = {0};
    CHECK(scan_next(12345, 0, &more, &count, &t, NULL) == ENGRAM_INVALID, "SCAN_NEXT of an unknown id");
    scan_close(12345);
    uint64_t id = 0;
    CHECK(scan_open("m", "n", false, 0, 0, &id, &more, &count, &t) == ENGRAM_OK && count == 128 && more,
          "default batch of 128 pairs");
    t.n = 0;
    CHECK(scan_next(id, 1000, &more, &count, &t, NULL) == ENGRAM_OK && count == 172 && !more,
          "the rest, and the scan ends: %zu pairs, more %d", count, more);
    CHECK(scan_next(id, 0, &more, &count, &t, NULL) == ENGRAM_INVALID, "an ended scan's id is released");
    t.n = 0;
    CHECK(scan_open("m010", "m020", true, 3, 2, &id, &more, &count, &t) == ENGRAM_OK && count == 2 && more &&
              !strcmp(t.s, "m019=m019;m018=m018;"),
          "reverse, limit 3, batch 2: %s", t.s);
    CHECK(scan_next(id, 2, &more, &count, &t, NULL) == ENGRAM_OK && count == 1 && !more, "the limit ends the scan");
    CHECK(scan_open("b", "a", false, 0, 0, &id, &more, &count, &t) == ENGRAM_OK && count == 0 && !more,
          "an inverted range is empty");
    /* An open scan is closed by CLOSE; everything after CLOSE is refused. */
    CHECK(scan_open("", "", false, 0, 1, &id, &more, &count, &t) == ENGRAM_OK && more, "a scan left open");
    CHECK(simple(ENGRAM_OP_CLOSE) == ENGRAM_OK, "CLOSE");
    CHECK(get("m001", v, sizeof v) == ENGRAM_INVALID, "GET after CLOSE");
    free(t.s);
    engram_instance_free(in);
}

/* Batches stay under a tiny max_response, and a pair that cannot fit in
 * any batch fails its scan cleanly. */
static void test_max_response(void) {
    enum { MAX = 120 };
    fresh("", MAX);
    char k[16], val[64];
    text want = {0}, got = {0};
    for (int i = 0; i < 50; i++) {
        snprintf(k, sizeof k, "r%02d", i);
        int vl = (i * 7) % 40;
        memset(val, 'a' + i % 26, (size_t)vl);
        val[vl] = 0;
        CHECK(put(k, val) == ENGRAM_OK, "put %s", k);
        tpair(&want, B(k), B(val));
    }
    uint64_t id;
    bool more;
    size_t count, len, batches = 1;
    CHECK(scan_open("", "", false, 0, 1000, &id, &more, &count, &got) == ENGRAM_OK, "open");
    while (more) {
        CHECK(scan_next(id, 1000, &more, &count, &got, &len) == ENGRAM_OK && len <= MAX,
              "batch of %zu bytes under a %d-byte limit", len, MAX);
        CHECK(count > 0 || !more, "a batch made progress");
        batches++;
    }
    CHECK(got.n == want.n && !strcmp(got.s, want.s), "all pairs in order across %zu batches", batches);
    CHECK(batches > 10, "the byte limit split the scan (%zu batches)", batches);

    char big[200];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = 0;
    CHECK(put("r99", big) == ENGRAM_OK, "put a value larger than a response");
    char v[8];
    CHECK(get("r99", v, sizeof v) == ENGRAM_INTERNAL, "GET of a value over max_response is INTERNAL, not a huge response");
    got.n = 0;
    CHECK(scan_open("r98", "", false, 0, 0, &id, &more, &count, &got) == ENGRAM_INTERNAL,
          "a pair over max_response fails the scan");
    free(want.s);
    free(got.s);
    finish();
}

/* ---- SIZE and RECLAIM ---- */

/* INIT on a new instance of vt; returns the manifest's ops bits (0 when
 * INIT fails) and its abi_minor in *minor. */
static uint64_t init_ops(const engram_plugin *vt, void *self, uint32_t *minor) {
    in = engram_instance_new(vt, self);
    if (!in) exit(2);
    engram_init_req m = {0, B(""), 0, 0, 0};
    engram_encode_init_req(&req, &m);
    engram_bytes r = dispatch(ENGRAM_OP_INIT);
    engram_wire_manifest man;
    if (r.ptr[0] != ENGRAM_OK || engram_decode_manifest(r.ptr + 1, r.len - 1, &man) != ENGRAM_E_OK) return 0;
    *minor = man.abi_minor;
    return man.ops;
}

/* A size and a reclaim callback answering what the test sets. */
static engram_status fake_status;
static uint64_t fake_bytes;

static engram_status fake_size(void *self, engram_call *call, uint64_t *bytes) {
    (void)self;
    *bytes = fake_bytes;
    return fake_status == ENGRAM_OK ? ENGRAM_OK : engram_fail(call, fake_status, "fake %s", engram_status_name(fake_status));
}

static engram_status fake_reclaim(void *self, engram_call *call) {
    (void)self;
    return fake_status == ENGRAM_OK ? ENGRAM_OK : engram_fail(call, fake_status, "fake %s", engram_status_name(fake_status));
}

/* The SDK's side: the manifest declares SIZE and RECLAIM exactly when
 * their callbacks are set, abi_minor is 1, and the callbacks' answers
 * become responses the ops may carry. */
static void test_size_reclaim_sdk(void) {
    void *self = NULL;
    engram_plugin vt = *engram_plugin_entry(&self);
    uint32_t minor = 99;
    const uint64_t base = ENGRAM_REQUIRED_OPS | 1u << ENGRAM_OP_PARTITIONS | 1u << ENGRAM_OP_IDLE;
    uint64_t ops = init_ops(&vt, self, &minor);
    CHECK(ops == (base | 1u << ENGRAM_OP_SIZE | 1u << ENGRAM_OP_RECLAIM) && minor == 1,
          "memkv declares SIZE and RECLAIM, ABI 1.1: ops 0x%llx, minor %u", (unsigned long long)ops, minor);
    finish();

    vt.size = NULL;
    vt.reclaim = NULL;
    ops = init_ops(&vt, self, &minor);
    CHECK(ops == base, "without the callbacks, no SIZE or RECLAIM bit: ops 0x%llx", (unsigned long long)ops);
    int64_t n;
    CHECK(size(&n) == ENGRAM_UNSUPPORTED, "SIZE without a size callback");
    CHECK(simple(ENGRAM_OP_RECLAIM) == ENGRAM_UNSUPPORTED, "RECLAIM without a reclaim callback");
    finish();

    vt.size = fake_size;
    vt.reclaim = fake_reclaim;
    ops = init_ops(&vt, self, &minor);
    CHECK(ops == (base | 1u << ENGRAM_OP_SIZE | 1u << ENGRAM_OP_RECLAIM), "fakes declared: ops 0x%llx",
          (unsigned long long)ops);
    fake_status = ENGRAM_OK;
    fake_bytes = (uint64_t)INT64_MAX;
    CHECK(size(&n) == ENGRAM_OK && n == INT64_MAX, "SIZE of 2^63-1 bytes: %lld", (long long)n);
    fake_bytes = (uint64_t)INT64_MAX + 1;
    engram_encode_empty_req(&req, &(engram_empty_req){0});
    engram_bytes r = dispatch(ENGRAM_OP_SIZE);
    CHECK(r.ptr[0] == ENGRAM_INTERNAL && strstr(message(r), "2^63"), "SIZE over an i64: %s", message(r));
    fake_bytes = 7;
    static const engram_status passed[] = {ENGRAM_UNSUPPORTED, ENGRAM_INVALID, ENGRAM_UNAVAILABLE, ENGRAM_DEADLINE,
                                           ENGRAM_INTERNAL};
    for (size_t i = 0; i < sizeof passed / sizeof passed[0]; i++) {
        fake_status = passed[i];
        engram_encode_empty_req(&req, &(engram_empty_req){0});
        r = dispatch(ENGRAM_OP_SIZE);
        CHECK(r.ptr[0] == passed[i] && strstr(message(r), "fake"), "SIZE answers %s: got %d %s",
              engram_status_name(passed[i]), r.ptr[0], message(r));
        CHECK(simple(ENGRAM_OP_RECLAIM) == (int)passed[i], "RECLAIM answers %s", engram_status_name(passed[i]));
    }
    static const engram_status refused[] = {ENGRAM_NOT_FOUND, ENGRAM_CONFLICT, ENGRAM_UNCERTAIN, (engram_status)42};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        fake_status = refused[i];
        CHECK(size(&n) == ENGRAM_INTERNAL, "SIZE may not answer %d", (int)refused[i]);
        CHECK(simple(ENGRAM_OP_RECLAIM) == ENGRAM_INTERNAL, "RECLAIM may not answer %d", (int)refused[i]);
    }
    fake_status = ENGRAM_OK;
    CHECK(simple(ENGRAM_OP_RECLAIM) == ENGRAM_OK, "RECLAIM OK");
    static const uint8_t trailing[] = {0x00, 0x00};
    for (int op = ENGRAM_OP_SIZE; op <= ENGRAM_OP_RECLAIM; op++) {
        engram_buf_reserve(&req, sizeof trailing);
        memcpy(req.ptr, trailing, sizeof trailing);
        req.len = sizeof trailing;
        r = dispatch(op);
        CHECK(r.ptr[0] == ENGRAM_INVALID && strstr(message(r), "malformed"), "%s with a trailing byte: %s",
              engram_op_name(op), message(r));
    }
    finish();
}

static int del(const char *k) {
    engram_op op = {ENGRAM_DELETE, B(k), {NULL, 0}, {NULL, 0}};
    return commit(&op, 1);
}

/* memkv's SIZE counts the keys and values it holds, the old versions an
 * open scan still reads included; RECLAIM keeps every live key. */
static void test_size_reclaim_memkv(void) {
    fresh("", 0);
    int64_t n;
    CHECK(size(&n) == ENGRAM_OK && n == 0, "empty: %lld", (long long)n);
    put("a", "xyz");
    CHECK(size(&n) == ENGRAM_OK && n == 4, "a=xyz: %lld", (long long)n);
    put("a", "xy");
    put("bb", "12");
    CHECK(size(&n) == ENGRAM_OK && n == 7, "a=xy bb=12: %lld", (long long)n);
    CHECK(del("a") == ENGRAM_OK && del("absent") == ENGRAM_OK, "deletes");
    CHECK(size(&n) == ENGRAM_OK && n == 4, "bb=12: %lld", (long long)n);

    uint64_t id;
    bool more;
    size_t count;
    text t = {0};
    put("cc", "");
    CHECK(scan_open("", "", false, 0, 1, &id, &more, &count, &t) == ENGRAM_OK && more, "a scan held open");
    put("bb", "3456"); /* the scan still reads "12" */
    del("cc");         /* ...and "cc" */
    CHECK(size(&n) == ENGRAM_OK && n == 2 + 2 + 4 + 2, "with versions kept for the scan: %lld", (long long)n);
    CHECK(simple(ENGRAM_OP_RECLAIM) == ENGRAM_OK, "RECLAIM with a scan open");
    CHECK(size(&n) == ENGRAM_OK && n == 10, "RECLAIM keeps what the scan reads: %lld", (long long)n);
    CHECK(scan_next(id, 10, &more, &count, &t, NULL) == ENGRAM_OK && !more && !strcmp(t.s, "bb=12;cc=;"),
          "the scan's snapshot survived RECLAIM: %s", t.s);
    CHECK(size(&n) == ENGRAM_OK && n == 6, "the scan's versions collected when it closed: %lld", (long long)n);

    /* Many keys, most deleted: RECLAIM shrinks the index, and every key
     * left is still found, as is every key written afterwards. */
    char k[16];
    for (int i = 0; i < 3000; i++) {
        snprintf(k, sizeof k, "n%04d", i);
        put(k, "v");
    }
    for (int i = 0; i < 3000; i++) {
        snprintf(k, sizeof k, "n%04d", i);
        if (i % 100) del(k);
    }
    CHECK(size(&n) == ENGRAM_OK && n == 6 + 30 * 6, "30 keys of 3000 left: %lld", (long long)n);
    CHECK(simple(ENGRAM_OP_RECLAIM) == ENGRAM_OK, "RECLAIM");
    char v[8];
    int found = 0, wrong = 0;
    for (int i = 0; i < 3000; i++) {
        snprintf(k, sizeof k, "n%04d", i);
        int st = get(k, v, sizeof v);
        found += st == ENGRAM_OK;
        wrong += st != (i % 100 ? ENGRAM_NOT_FOUND : ENGRAM_OK);
    }
    CHECK(found == 30 && wrong == 0, "after RECLAIM: %d keys found, %d wrong", found, wrong);
    for (int i = 0; i < 200; i++) {
        snprintf(k, sizeof k, "p%04d", i);
        put(k, "w");
    }
    for (int i = 0; i < 200; i++) {
        snprintf(k, sizeof k, "p%04d", i);
        wrong += get(k, v, sizeof v) != ENGRAM_OK || strcmp(v, "w");
    }
    CHECK(wrong == 0 && size(&n) == ENGRAM_OK && n == 186 + 200 * 6, "writes after RECLAIM: %d wrong, %lld bytes",
          wrong, (long long)n);
    t.n = 0;
    CHECK(scan_open("bb", "n0100", false, 0, 0, &id, &more, &count, &t) == ENGRAM_OK && !more &&
              !strcmp(t.s, "bb=3456;n0000=v;"),
          "a scan after RECLAIM: %s", t.s);
    free(t.s);
    finish();
}

/* ---- randomized snapshots against a model ---- */

enum { NKEYS = 64, NSCANS = 4 };

typedef struct model {
    bool present[NKEYS];
    char value[NKEYS][24];
} model;

static uint64_t rng = 0x2545f4914f6cdd1dULL;

static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static void key_name(char *k, int i) { snprintf(k, 8, "k%02d", i % 100); }

typedef struct open_scan {
    bool open;
    uint64_t id;
    uint32_t bs;
    text want, got;
} open_scan;

/* What a scan of [lo, hi) (key indexes) over m must return. */
static void expect_scan(const model *m, int lo, int hi, bool reverse, uint64_t limit, text *t) {
    t->n = 0;
    tadd(t, (const uint8_t *)"", 0);
    uint64_t n = 0;
    for (int j = 0; j < hi - lo && (limit == 0 || n < limit); j++) {
        int i = reverse ? hi - 1 - j : lo + j;
        if (!m->present[i]) continue;
        char k[8];
        key_name(k, i);
        tpair(t, B(k), B(m->value[i]));
        n++;
    }
}

static void test_snapshots(void) {
    fresh("", 256);
    model m;
    memset(&m, 0, sizeof m);
    open_scan scans[NSCANS];
    memset(scans, 0, sizeof scans);
    int commits = 0, verified = 0, sized = 0;
    for (int step = 0; step < 20000; step++) {
        uint32_t what = rnd(100);
        if (what < 45) { /* a batch of up to 4 writes on distinct keys */
            engram_op ops[4];
            char k[4][8], v[4][24];
            int idx[4], n = 1 + (int)rnd(4);
            model next = m;
            bool conflict = false;
            for (int j = 0; j < n; j++) {
                int i;
                bool again;
                do { /* distinct keys */
                    i = (int)rnd(NKEYS);
                    again = false;
                    for (int q = 0; q < j; q++) again |= idx[q] == i;
                } while (again);
                idx[j] = i;
                key_name(k[j], i);
                snprintf(v[j], sizeof v[j], "v%d-%u", step, rnd(1000));
                uint32_t kind = rnd(5) + 1;
                ops[j] = (engram_op){(engram_op_kind)kind, B(k[j]), {0}, {0}};
                if (kind == ENGRAM_PUT || kind == ENGRAM_PUT_IF_ABSENT || kind == ENGRAM_COMPARE_AND_SWAP)
                    ops[j].value = B(v[j]);
                if (kind == ENGRAM_COMPARE_AND_SWAP || kind == ENGRAM_COMPARE_AND_DELETE)
                    ops[j].expected = rnd(4) ? B(m.value[i]) : B("nope");
                bool ok = kind == ENGRAM_PUT_IF_ABSENT ? !m.present[i]
                        : kind >= ENGRAM_COMPARE_AND_SWAP
                            ? m.present[i] && ops[j].expected.len == strlen(m.value[i]) &&
                                  !memcmp(ops[j].expected.ptr, m.value[i], ops[j].expected.len)
                            : true;
                conflict |= !ok;
                bool del = kind == ENGRAM_DELETE || kind == ENGRAM_COMPARE_AND_DELETE;
                next.present[i] = !del;
                if (!del) memcpy(next.value[i], v[j], sizeof v[j]);
            }
            int st = commit(ops, (size_t)n);
            CHECK(st == (conflict ? ENGRAM_CONFLICT : ENGRAM_OK), "step %d: commit status %d, want %s", step, st,
                  conflict ? "CONFLICT" : "OK");
            if (!conflict) m = next;
            commits++;
        } else if (what < 60) { /* open a scan, keeping its expected result */
            int s = (int)rnd(NSCANS);
            if (scans[s].open) continue;
            int lo = (int)rnd(NKEYS), hi = (int)rnd(NKEYS + 1);
            if (hi <= lo) hi = NKEYS;
            bool reverse = rnd(2);
            uint64_t limit = rnd(3) ? 0 : rnd(20);
            char a[8] = "", b[8] = "";
            if (lo > 0) key_name(a, lo);
            if (hi < NKEYS) key_name(b, hi);
            open_scan *sc = &scans[s];
            expect_scan(&m, lo, hi, reverse, limit, &sc->want);
            sc->got.n = 0;
            tadd(&sc->got, (const uint8_t *)"", 0);
            sc->bs = rnd(6);
            bool more;
            size_t count;
            CHECK(scan_open(a, b, reverse, limit, sc->bs, &sc->id, &more, &count, &sc->got) == ENGRAM_OK, "open");
            sc->open = more;
            if (!more) {
                CHECK(!strcmp(sc->got.s, sc->want.s), "step %d: one-batch scan\n got %s\nwant %s", step,
                      sc->got.s, sc->want.s);
                verified++;
            }
        } else if (what < 90) { /* advance an open scan */
            open_scan *sc = &scans[rnd(NSCANS)];
            if (!sc->open) continue;
            bool more;
            size_t count;
            CHECK(scan_next(sc->id, sc->bs, &more, &count, &sc->got, NULL) == ENGRAM_OK, "next");
            if (!more) {
                sc->open = false;
                CHECK(!strcmp(sc->got.s, sc->want.s), "step %d: held scan\n got %s\nwant %s", step, sc->got.s,
                      sc->want.s);
                verified++;
            }
        } else if (what < 95) { /* abandon a scan */
            open_scan *sc = &scans[rnd(NSCANS)];
            if (sc->open) scan_close(sc->id);
            sc->open = false;
        } else if (what < 97) { /* housekeeping; then, with no scan open, nothing old is held */
            int op = rnd(2) ? ENGRAM_OP_IDLE : ENGRAM_OP_RECLAIM;
            CHECK(simple(op) == ENGRAM_OK, "%s", engram_op_name(op));
            bool open = false;
            for (int s = 0; s < NSCANS; s++) open |= scans[s].open;
            int64_t held, live = 0;
            for (int i = 0; i < NKEYS; i++)
                if (m.present[i]) live += 3 + (int64_t)strlen(m.value[i]);
            CHECK(size(&held) == ENGRAM_OK && (open ? held >= live : held == live),
                  "step %d: SIZE %lld, live keys and values %lld, scans open %d", step, (long long)held,
                  (long long)live, open);
            sized += !open;
        } else { /* every key, now */
            char k[8], v[24];
            int i = (int)rnd(NKEYS);
            key_name(k, i);
            int st = get(k, v, sizeof v);
            CHECK(st == (m.present[i] ? ENGRAM_OK : ENGRAM_NOT_FOUND) && (!m.present[i] || !strcmp(v, m.value[i])),
                  "step %d: GET %s = %d %s", step, k, st, v);
        }
    }
    CHECK(verified > 1000, "%d scans verified over %d commits", verified, commits);
    CHECK(sized > 20, "SIZE checked exactly %d times", sized);
    for (int s = 0; s < NSCANS; s++) {
        free(scans[s].want.s);
        free(scans[s].got.s);
    }
    finish(); /* with scans still open: CLOSE releases them (the leak checker agrees) */
}

/* Random requests and bit-flipped valid ones, for every op but CLOSE:
 * each must get a well-framed response (checked by dispatch) whatever the
 * bytes, and the sanitizers must stay quiet. */
static void test_fuzz(void) {
    fresh("", 512);
    CHECK(put("fa", "1") == ENGRAM_OK && put("fb", "2") == ENGRAM_OK, "seed");
    static const int ops[] = {0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 255};
    int invalid = 0;
    for (int step = 0; step < 100000; step++) {
        int op = ops[rnd(sizeof ops / sizeof ops[0])];
        req.len = 0;
        if (rnd(2)) { /* a valid request of op, then a few flipped bits */
            engram_op cops[2] = {{ENGRAM_COMPARE_AND_SWAP, B("fa"), B("3"), B("1")}, {ENGRAM_DELETE, B("fc"), {0}, {0}}};
            switch (op) {
            case ENGRAM_OP_GET: engram_encode_get_req(&req, &(engram_get_req){0, B("fa")}); break;
            case ENGRAM_OP_SCAN_OPEN:
                engram_encode_scan_open_req(&req, &(engram_scan_open_req){0, B("f"), B("g"), rnd(2), rnd(3), rnd(3)});
                break;
            case ENGRAM_OP_SCAN_NEXT: engram_encode_scan_next_req(&req, &(engram_scan_next_req){0, rnd(3), 1}); break;
            case ENGRAM_OP_COMMIT: engram_encode_commit_req(&req, &(engram_commit_req){0, cops, 2}); break;
            case ENGRAM_OP_PARTITIONS:
                engram_encode_partitions_req(&req, &(engram_partitions_req){0, B("a"), B("z"), 2});
                break;
            default: engram_encode_empty_req(&req, &(engram_empty_req){0});
            }
            for (uint32_t k = rnd(4); k > 0 && req.len > 0; k--) req.ptr[rnd((uint32_t)req.len)] ^= (uint8_t)(1u << rnd(8));
        } else {
            size_t n = rnd(40);
            engram_buf_reserve(&req, n);
            for (size_t i = 0; i < n; i++) req.ptr[i] = (uint8_t)rnd(256);
            req.len = n;
        }
        invalid += dispatch(op).ptr[0] == ENGRAM_INVALID;
    }
    CHECK(invalid > 10000, "most garbage is refused as INVALID (%d)", invalid);
    finish();
}

int main(void) {
    test_protocol();
    test_max_response();
    test_size_reclaim_sdk();
    test_size_reclaim_memkv();
    test_snapshots();
    test_fuzz();
    engram_buf_free(&req);
    printf("dispatch: %d checks passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
