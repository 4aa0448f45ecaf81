/*
 * engram_plugin.c - the C SDK for Engram storage plugins (ABI 1.1).
 *
 * This file owns, in order: the codec (strict decoders over a sticky-error
 * reader, size-then-write encoders), the dispatcher (engram_instance: the
 * request and response buffers, status mapping, the checks ABI.md puts on
 * the plugin side, scan ids and batching), the host imports, and the three
 * wasm exports over one static instance.
 *
 * It must not allocate per call in steady state (every buffer is owned by
 * the instance, grows geometrically and is reused), must never read outside
 * a request or trust a length in it, and must never hand the host a
 * response that breaks ABI.md sections 2 and 4 (the host would discard the
 * instance and, for a single-model plugin, its data): every callback result
 * is checked before it becomes a response.
 */
#if !defined(__wasm__) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* clock_gettime for the native stand-ins */
#endif

#include "engram_plugin.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ======================================================================
 * Codec
 * ==================================================================== */

size_t engram_uvarint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

size_t engram_put_uvarint(uint8_t *dst, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        dst[n++] = (uint8_t)v | 0x80;
        v >>= 7;
    }
    dst[n++] = (uint8_t)v;
    return n;
}

static uint8_t *put_uv(uint8_t *p, uint64_t v) {
    return p + engram_put_uvarint(p, v);
}

static uint8_t *put_bytes(uint8_t *p, engram_bytes s) {
    p = put_uv(p, s.len);
    if (s.len > 0) {
        memcpy(p, s.ptr, s.len);
        p += s.len;
    }
    return p;
}

static size_t bytes_len(size_t n) { return engram_uvarint_len(n) + n; }

/* The reader decodes one message. Errors are sticky: after the first,
 * every read returns zero and the decoder checks once at the end. It reads
 * b[off] only after checking off < n, so no input makes it leave [b, b+n),
 * and it never forms b + off with a NULL b (n is 0 then). */
typedef struct reader {
    const uint8_t *b;
    size_t n;
    size_t off;
    engram_err err;
} reader;

static reader rd_new(const uint8_t *b, size_t n) {
    reader r = {b, b ? n : 0, 0, ENGRAM_E_OK};
    return r;
}

static void rd_fail(reader *r, engram_err e) {
    if (r->err == ENGRAM_E_OK) r->err = e;
}

static size_t rd_left(const reader *r) { return r->n - r->off; }

static uint64_t rd_uvarint(reader *r) {
    if (r->err) return 0;
    uint64_t v = 0;
    for (unsigned i = 0; i < 10; i++) {
        if (r->off >= r->n) {
            rd_fail(r, ENGRAM_E_SHORT);
            return 0;
        }
        uint8_t c = r->b[r->off++];
        if (c < 0x80) {
            if (i == 9 && c > 1) { /* bits beyond 64 */
                rd_fail(r, ENGRAM_E_OVERFLOW);
                return 0;
            }
            if (c == 0 && i > 0) { /* a zero last group: not shortest */
                rd_fail(r, ENGRAM_E_NOT_SHORTEST);
                return 0;
            }
            return v | (uint64_t)c << (7 * i);
        }
        v |= (uint64_t)(c & 0x7f) << (7 * i);
    }
    rd_fail(r, ENGRAM_E_OVERFLOW); /* an 11th byte would follow */
    return 0;
}

static uint32_t rd_u32(reader *r) {
    uint64_t v = rd_uvarint(r);
    if (v > UINT32_MAX) {
        rd_fail(r, ENGRAM_E_OVERFLOW);
        return 0;
    }
    return (uint32_t)v;
}

static int64_t rd_i64(reader *r) {
    uint64_t v = rd_uvarint(r);
    if (v > (uint64_t)INT64_MAX) {
        rd_fail(r, ENGRAM_E_OVERFLOW);
        return 0;
    }
    return (int64_t)v;
}

static uint8_t rd_byte(reader *r) {
    if (r->err) return 0;
    if (r->off >= r->n) {
        rd_fail(r, ENGRAM_E_SHORT);
        return 0;
    }
    return r->b[r->off++];
}

static bool rd_bool(reader *r) {
    uint8_t c = rd_byte(r);
    if (c > 1) rd_fail(r, ENGRAM_E_BAD_VALUE);
    return c == 1;
}

static engram_bytes rd_bytes(reader *r) {
    engram_bytes s = {NULL, 0};
    uint64_t n = rd_uvarint(r);
    if (r->err) return s;
    if (n > rd_left(r)) {
        rd_fail(r, ENGRAM_E_SHORT);
        return s;
    }
    s.ptr = r->b + r->off;
    s.len = (size_t)n;
    r->off += (size_t)n;
    return s;
}

/* A count of elements of at least min_size bytes each: more than the rest
 * of the message can hold is garbage, refused before anyone sizes an
 * array by it. */
static size_t rd_count(reader *r, size_t min_size) {
    uint64_t n = rd_uvarint(r);
    if (r->err) return 0;
    if (n > rd_left(r) / min_size) {
        rd_fail(r, ENGRAM_E_COUNT);
        return 0;
    }
    return (size_t)n;
}

/* The end of a fixed-layout message: its first error, or trailing bytes. */
static engram_err rd_finish(const reader *r) {
    if (r->err) return r->err;
    return r->off == r->n ? ENGRAM_E_OK : ENGRAM_E_TRAILING;
}

engram_err engram_get_uvarint(const uint8_t *b, size_t n, uint64_t *v,
                              size_t *used) {
    reader r = rd_new(b, n);
    *v = rd_uvarint(&r);
    *used = r.off;
    return r.err;
}

const char *engram_err_str(engram_err e) {
    switch (e) {
    case ENGRAM_E_OK: return "ok";
    case ENGRAM_E_SHORT: return "message truncated";
    case ENGRAM_E_OVERFLOW: return "varint overflows its field";
    case ENGRAM_E_NOT_SHORTEST: return "varint not in shortest form";
    case ENGRAM_E_TRAILING: return "trailing bytes after message";
    case ENGRAM_E_BAD_VALUE: return "field holds an invalid value";
    case ENGRAM_E_COUNT: return "element count exceeds message size";
    case ENGRAM_E_ROOM: return "caller's array too small";
    }
    return "unknown error";
}

const char *engram_status_name(int st) {
    static const char *const names[] = {
        "OK", "NOT_FOUND", "CONFLICT", "UNCERTAIN", "UNSUPPORTED",
        "INVALID", "UNAVAILABLE", "DEADLINE", "INTERNAL",
    };
    return st >= 0 && st <= ENGRAM_INTERNAL ? names[st] : "?";
}

const char *engram_op_name(int op) {
    static const char *const names[] = {
        "?", "INIT", "GET", "SCAN_OPEN", "SCAN_NEXT", "SCAN_CLOSE",
        "COMMIT", "PARTITIONS", "CLOSE", "IDLE", "SIZE", "RECLAIM",
    };
    return op >= 1 && op <= ENGRAM_OP_RECLAIM ? names[op] : "?";
}

bool engram_status_allowed(int op, int st) {
    switch (st) {
    case ENGRAM_OK:
        return true;
    case ENGRAM_NOT_FOUND:
        return op == ENGRAM_OP_GET;
    case ENGRAM_CONFLICT:
    case ENGRAM_UNCERTAIN:
        return op == ENGRAM_OP_COMMIT;
    case ENGRAM_UNSUPPORTED:
    case ENGRAM_INVALID:
    case ENGRAM_UNAVAILABLE:
    case ENGRAM_DEADLINE:
    case ENGRAM_INTERNAL:
        return true;
    }
    return false;
}

bool engram_buf_reserve(engram_buf *b, size_t n) {
    if (n <= b->cap - b->len) return true;
    size_t need = b->len + n;
    if (need < b->len) return false; /* size_t overflow */
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint8_t *p = realloc(b->ptr, cap);
    if (!p) return false;
    b->ptr = p;
    b->cap = cap;
    return true;
}

void engram_buf_free(engram_buf *b) {
    free(b->ptr);
    b->ptr = NULL;
    b->len = b->cap = 0;
}

/* Encoders size the message, reserve once, then write without checks:
 * one capacity check per message instead of one per field. */
static uint8_t *buf_room(engram_buf *b, size_t n) {
    return engram_buf_reserve(b, n) ? b->ptr + b->len : NULL;
}

static bool buf_done(engram_buf *b, const uint8_t *end) {
    b->len = (size_t)(end - b->ptr);
    return true;
}

bool engram_buf_put_uvarint(engram_buf *b, uint64_t v) {
    uint8_t *p = buf_room(b, 10);
    return p && buf_done(b, put_uv(p, v));
}

bool engram_buf_put_bytes(engram_buf *b, engram_bytes s) {
    uint8_t *p = buf_room(b, bytes_len(s.len));
    return p && buf_done(b, put_bytes(p, s));
}

/* ---- requests ---- */

engram_err engram_decode_header(const uint8_t *b, size_t n, int64_t *deadline) {
    reader r = rd_new(b, n);
    *deadline = rd_i64(&r);
    return r.err;
}

engram_err engram_decode_init_req(const uint8_t *b, size_t n, engram_init_req *m) {
    reader r = rd_new(b, n);
    m->deadline = rd_i64(&r);
    m->config = rd_bytes(&r);
    m->host_flags = rd_uvarint(&r);
    m->instance = rd_u32(&r);
    m->max_response = rd_u32(&r);
    return r.err; /* extensible: later minors may append fields */
}

bool engram_encode_init_req(engram_buf *buf, const engram_init_req *m) {
    size_t n = engram_uvarint_len((uint64_t)m->deadline) + bytes_len(m->config.len) +
               engram_uvarint_len(m->host_flags) + engram_uvarint_len(m->instance) +
               engram_uvarint_len(m->max_response);
    uint8_t *p = buf_room(buf, n);
    if (!p) return false;
    p = put_uv(p, (uint64_t)m->deadline);
    p = put_bytes(p, m->config);
    p = put_uv(p, m->host_flags);
    p = put_uv(p, m->instance);
    p = put_uv(p, m->max_response);
    return buf_done(buf, p);
}

engram_err engram_decode_get_req(const uint8_t *b, size_t n, engram_get_req *m) {
    reader r = rd_new(b, n);
    m->deadline = rd_i64(&r);
    m->key = rd_bytes(&r);
    return rd_finish(&r);
}

bool engram_encode_get_req(engram_buf *buf, const engram_get_req *m) {
    uint8_t *p = buf_room(buf, engram_uvarint_len((uint64_t)m->deadline) + bytes_len(m->key.len));
    if (!p) return false;
    p = put_uv(p, (uint64_t)m->deadline);
    return buf_done(buf, put_bytes(p, m->key));
}

engram_err engram_decode_scan_open_req(const uint8_t *b, size_t n, engram_scan_open_req *m) {
    reader r = rd_new(b, n);
    m->deadline = rd_i64(&r);
    m->start = rd_bytes(&r);
    m->end = rd_bytes(&r);
    uint8_t flags = rd_byte(&r);
    m->reverse = (flags & ENGRAM_SCAN_REVERSE) != 0;
    m->limit = rd_uvarint(&r);
    m->batch_size = rd_u32(&r);
    engram_err e = rd_finish(&r);
    if (e == ENGRAM_E_OK && (flags & ~ENGRAM_SCAN_REVERSE) != 0) e = ENGRAM_E_BAD_VALUE;
    return e;
}

bool engram_encode_scan_open_req(engram_buf *buf, const engram_scan_open_req *m) {
    size_t n = engram_uvarint_len((uint64_t)m->deadline) + bytes_len(m->start.len) +
               bytes_len(m->end.len) + 1 + engram_uvarint_len(m->limit) +
               engram_uvarint_len(m->batch_size);
    uint8_t *p = buf_room(buf, n);
    if (!p) return false;
    p = put_uv(p, (uint64_t)m->deadline);
    p = put_bytes(p, m->start);
    p = put_bytes(p, m->end);
    *p++ = m->reverse ? ENGRAM_SCAN_REVERSE : 0;
    p = put_uv(p, m->limit);
    p = put_uv(p, m->batch_size);
    return buf_done(buf, p);
}

engram_err engram_decode_scan_next_req(const uint8_t *b, size_t n, engram_scan_next_req *m) {
    reader r = rd_new(b, n);
    m->deadline = rd_i64(&r);
    m->id = rd_uvarint(&r);
    m->batch_size = rd_u32(&r);
    return rd_finish(&r);
}

bool engram_encode_scan_next_req(engram_buf *buf, const engram_scan_next_req *m) {
    uint8_t *p = buf_room(buf, 30);
    if (!p) return false;
    p = put_uv(p, (uint64_t)m->deadline);
    p = put_uv(p, m->id);
    return buf_done(buf, put_uv(p, m->batch_size));
}

engram_err engram_decode_scan_close_req(const uint8_t *b, size_t n, engram_scan_close_req *m) {
    reader r = rd_new(b, n);
    m->deadline = rd_i64(&r);
    m->id = rd_uvarint(&r);
    return rd_finish(&r);
}

bool engram_encode_scan_close_req(engram_buf *buf, const engram_scan_close_req *m) {
    uint8_t *p = buf_room(buf, 20);
    if (!p) return false;
    p = put_uv(p, (uint64_t)m->deadline);
    return buf_done(buf, put_uv(p, m->id));
}

static bool kind_has_value(unsigned k) {
    return k == ENGRAM_PUT || k == ENGRAM_PUT_IF_ABSENT || k == ENGRAM_COMPARE_AND_SWAP;
}

static bool kind_has_expected(unsigned k) {
    return k == ENGRAM_COMPARE_AND_SWAP || k == ENGRAM_COMPARE_AND_DELETE;
}

engram_err engram_decode_commit_req(const uint8_t *b, size_t n, engram_commit_req *m, size_t cap) {
    reader r = rd_new(b, n);
    m->deadline = rd_i64(&r);
    /* The smallest op is a DELETE of an empty key: 2 bytes. */
    size_t count = rd_count(&r, 2);
    m->count = 0;
    if (r.err) return r.err;
    if (count > cap) {
        m->count = count;
        return ENGRAM_E_ROOM;
    }
    static const engram_bytes none = {NULL, 0};
    for (size_t i = 0; i < count && !r.err; i++) {
        engram_op *op = &m->ops[i];
        uint8_t kind = rd_byte(&r);
        if (!r.err && (kind < ENGRAM_PUT || kind > ENGRAM_COMPARE_AND_DELETE)) {
            rd_fail(&r, ENGRAM_E_BAD_VALUE);
            break;
        }
        op->kind = (engram_op_kind)kind;
        op->key = rd_bytes(&r);
        op->expected = kind_has_expected(kind) ? rd_bytes(&r) : none;
        op->value = kind_has_value(kind) ? rd_bytes(&r) : none;
        m->count = i + 1;
    }
    engram_err e = rd_finish(&r);
    if (e) m->count = 0;
    return e;
}

bool engram_encode_commit_req(engram_buf *buf, const engram_commit_req *m) {
    size_t n = engram_uvarint_len((uint64_t)m->deadline) + engram_uvarint_len(m->count);
    for (size_t i = 0; i < m->count; i++) {
        const engram_op *op = &m->ops[i];
        n += 1 + bytes_len(op->key.len);
        if (kind_has_expected(op->kind)) n += bytes_len(op->expected.len);
        if (kind_has_value(op->kind)) n += bytes_len(op->value.len);
    }
    uint8_t *p = buf_room(buf, n);
    if (!p) return false;
    p = put_uv(p, (uint64_t)m->deadline);
    p = put_uv(p, m->count);
    for (size_t i = 0; i < m->count; i++) {
        const engram_op *op = &m->ops[i];
        *p++ = (uint8_t)op->kind;
        p = put_bytes(p, op->key);
        if (kind_has_expected(op->kind)) p = put_bytes(p, op->expected);
        if (kind_has_value(op->kind)) p = put_bytes(p, op->value);
    }
    return buf_done(buf, p);
}

engram_err engram_decode_partitions_req(const uint8_t *b, size_t n, engram_partitions_req *m) {
    reader r = rd_new(b, n);
    m->deadline = rd_i64(&r);
    m->start = rd_bytes(&r);
    m->end = rd_bytes(&r);
    m->max_parts = rd_u32(&r);
    return rd_finish(&r);
}

bool engram_encode_partitions_req(engram_buf *buf, const engram_partitions_req *m) {
    size_t n = engram_uvarint_len((uint64_t)m->deadline) + bytes_len(m->start.len) +
               bytes_len(m->end.len) + engram_uvarint_len(m->max_parts);
    uint8_t *p = buf_room(buf, n);
    if (!p) return false;
    p = put_uv(p, (uint64_t)m->deadline);
    p = put_bytes(p, m->start);
    p = put_bytes(p, m->end);
    return buf_done(buf, put_uv(p, m->max_parts));
}

engram_err engram_decode_empty_req(const uint8_t *b, size_t n, engram_empty_req *m) {
    reader r = rd_new(b, n);
    m->deadline = rd_i64(&r);
    return rd_finish(&r);
}

bool engram_encode_empty_req(engram_buf *buf, const engram_empty_req *m) {
    return engram_buf_put_uvarint(buf, (uint64_t)m->deadline);
}

/* ---- responses ---- */

engram_err engram_split_response(const uint8_t *b, size_t n, int *status,
                                 const uint8_t **body, size_t *body_len) {
    *status = -1;
    *body = NULL;
    *body_len = 0;
    if (!b || n == 0) return ENGRAM_E_SHORT;
    *status = b[0];
    if (b[0] > ENGRAM_INTERNAL) return ENGRAM_E_BAD_VALUE;
    *body = b + 1;
    *body_len = n - 1;
    return ENGRAM_E_OK;
}

engram_err engram_decode_manifest(const uint8_t *b, size_t n, engram_wire_manifest *m) {
    reader r = rd_new(b, n);
    m->name = rd_bytes(&r);
    m->version = rd_bytes(&r);
    m->abi_minor = rd_u32(&r);
    m->model = rd_byte(&r);
    m->max_instances = rd_u32(&r);
    m->ops = rd_uvarint(&r);
    m->features = rd_uvarint(&r);
    m->max_commit_ops = rd_u32(&r);
    m->max_commit_bytes = rd_u32(&r);
    m->max_scan_batch = rd_u32(&r);
    return r.err; /* extensible */
}

bool engram_encode_manifest(engram_buf *buf, const engram_wire_manifest *m) {
    size_t n = 1 + bytes_len(m->name.len) + bytes_len(m->version.len) + 1 + 8 * 10;
    uint8_t *p = buf_room(buf, n);
    if (!p) return false;
    *p++ = ENGRAM_OK;
    p = put_bytes(p, m->name);
    p = put_bytes(p, m->version);
    p = put_uv(p, m->abi_minor);
    *p++ = m->model;
    p = put_uv(p, m->max_instances);
    p = put_uv(p, m->ops);
    p = put_uv(p, m->features);
    p = put_uv(p, m->max_commit_ops);
    p = put_uv(p, m->max_commit_bytes);
    return buf_done(buf, put_uv(p, m->max_scan_batch));
}

static engram_err decode_one_bytes(const uint8_t *b, size_t n, engram_bytes *out) {
    reader r = rd_new(b, n);
    *out = rd_bytes(&r);
    return rd_finish(&r);
}

engram_err engram_decode_value(const uint8_t *b, size_t n, engram_bytes *value) {
    return decode_one_bytes(b, n, value);
}

engram_err engram_decode_message(const uint8_t *b, size_t n, engram_bytes *msg) {
    return decode_one_bytes(b, n, msg);
}

static bool encode_status_bytes(engram_buf *buf, unsigned st, engram_bytes s) {
    uint8_t *p = buf_room(buf, 1 + bytes_len(s.len));
    if (!p) return false;
    *p++ = (uint8_t)st;
    return buf_done(buf, put_bytes(p, s));
}

bool engram_encode_value(engram_buf *buf, engram_bytes value) {
    return encode_status_bytes(buf, ENGRAM_OK, value);
}

bool engram_encode_error(engram_buf *buf, engram_status st, engram_bytes msg) {
    return encode_status_bytes(buf, st, msg);
}

bool engram_encode_status(engram_buf *buf, engram_status st) {
    uint8_t *p = buf_room(buf, 1);
    if (!p) return false;
    *p++ = (uint8_t)st;
    return buf_done(buf, p);
}

engram_err engram_decode_empty(const uint8_t *b, size_t n) {
    (void)b;
    return n == 0 ? ENGRAM_E_OK : ENGRAM_E_TRAILING;
}

engram_err engram_decode_conflict(const uint8_t *b, size_t n, engram_conflict *c) {
    reader r = rd_new(b, n);
    c->index = rd_u32(&r);
    c->exists = rd_bool(&r);
    c->current = rd_bytes(&r);
    return rd_finish(&r);
}

bool engram_encode_conflict(engram_buf *buf, const engram_conflict *c) {
    uint8_t *p = buf_room(buf, 1 + 5 + 1 + bytes_len(c->current.len));
    if (!p) return false;
    *p++ = ENGRAM_CONFLICT;
    p = put_uv(p, c->index);
    *p++ = c->exists ? 1 : 0;
    return buf_done(buf, put_bytes(p, c->current));
}

static void rd_batch(reader *r, engram_pair *pairs, size_t cap, size_t *count, bool *more) {
    size_t n = rd_count(r, 2);
    *count = 0;
    *more = false;
    if (r->err) return;
    if (n > cap) {
        *count = n;
        rd_fail(r, ENGRAM_E_ROOM);
        return;
    }
    for (size_t i = 0; i < n && !r->err; i++) {
        pairs[i].key = rd_bytes(r);
        pairs[i].value = rd_bytes(r);
    }
    *more = rd_bool(r);
    *count = r->err ? 0 : n;
}

engram_err engram_decode_scan_opened(const uint8_t *b, size_t n, uint64_t *id,
                                     engram_pair *pairs, size_t cap,
                                     size_t *count, bool *more) {
    reader r = rd_new(b, n);
    *id = rd_uvarint(&r);
    rd_batch(&r, pairs, cap, count, more);
    return r.err == ENGRAM_E_ROOM ? r.err : rd_finish(&r);
}

engram_err engram_decode_batch(const uint8_t *b, size_t n, engram_pair *pairs,
                               size_t cap, size_t *count, bool *more) {
    reader r = rd_new(b, n);
    rd_batch(&r, pairs, cap, count, more);
    return r.err == ENGRAM_E_ROOM ? r.err : rd_finish(&r);
}

static size_t pairs_len(const engram_pair *pairs, size_t count) {
    size_t n = engram_uvarint_len(count) + 1;
    for (size_t i = 0; i < count; i++)
        n += bytes_len(pairs[i].key.len) + bytes_len(pairs[i].value.len);
    return n;
}

static uint8_t *put_pairs(uint8_t *p, const engram_pair *pairs, size_t count, bool more) {
    p = put_uv(p, count);
    for (size_t i = 0; i < count; i++) {
        p = put_bytes(p, pairs[i].key);
        p = put_bytes(p, pairs[i].value);
    }
    *p++ = more ? 1 : 0;
    return p;
}

bool engram_encode_scan_opened(engram_buf *buf, uint64_t id, const engram_pair *pairs,
                               size_t count, bool more) {
    uint8_t *p = buf_room(buf, 1 + engram_uvarint_len(id) + pairs_len(pairs, count));
    if (!p) return false;
    *p++ = ENGRAM_OK;
    p = put_uv(p, id);
    return buf_done(buf, put_pairs(p, pairs, count, more));
}

bool engram_encode_batch(engram_buf *buf, const engram_pair *pairs, size_t count, bool more) {
    uint8_t *p = buf_room(buf, 1 + pairs_len(pairs, count));
    if (!p) return false;
    *p++ = ENGRAM_OK;
    return buf_done(buf, put_pairs(p, pairs, count, more));
}

engram_err engram_decode_partitions(const uint8_t *b, size_t n, engram_range *ranges,
                                    size_t cap, size_t *count) {
    reader r = rd_new(b, n);
    size_t c = rd_count(&r, 2);
    *count = 0;
    if (r.err) return r.err;
    if (c > cap) {
        *count = c;
        return ENGRAM_E_ROOM;
    }
    for (size_t i = 0; i < c && !r.err; i++) {
        ranges[i].start = rd_bytes(&r);
        ranges[i].end = rd_bytes(&r);
    }
    engram_err e = rd_finish(&r);
    *count = e ? 0 : c;
    return e;
}

engram_err engram_decode_size(const uint8_t *b, size_t n, int64_t *bytes) {
    reader r = rd_new(b, n);
    *bytes = rd_i64(&r);
    return rd_finish(&r);
}

bool engram_encode_size(engram_buf *buf, int64_t bytes) {
    uint8_t *p = buf_room(buf, 1 + 10);
    if (!p) return false;
    *p++ = ENGRAM_OK;
    return buf_done(buf, put_uv(p, (uint64_t)bytes));
}

bool engram_encode_partitions(engram_buf *buf, const engram_range *ranges, size_t count) {
    size_t n = 1 + engram_uvarint_len(count);
    for (size_t i = 0; i < count; i++)
        n += bytes_len(ranges[i].start.len) + bytes_len(ranges[i].end.len);
    uint8_t *p = buf_room(buf, n);
    if (!p) return false;
    *p++ = ENGRAM_OK;
    p = put_uv(p, count);
    for (size_t i = 0; i < count; i++) {
        p = put_bytes(p, ranges[i].start);
        p = put_bytes(p, ranges[i].end);
    }
    return buf_done(buf, p);
}

/* ======================================================================
 * Dispatcher
 * ==================================================================== */

enum {
    DEFAULT_MAX_RESPONSE = 64u << 20, /* assumed until INIT says */
    DEFAULT_BATCH = 128,              /* pairs when the host sends 0 */
    MIN_REQUEST_BUFFER = 64 << 10,
    MSG_CAP = 1024,
    /* Room kept in front of a batch for its head (status, scan id, pair
     * count): written right-aligned once the count is known, so the pairs
     * are encoded once, in place, and never moved. */
    SCAN_HEAD = 1 + 10 + 10,
    PARTS_HEAD = 1 + 10,
    /* Scan ids are (sequence << SLOT_BITS | slot): O(1) lookup, and a stale
     * or forged id never matches a reused slot. */
    SLOT_BITS = 24,
};
#define SLOT_MASK ((UINT64_C(1) << SLOT_BITS) - 1)
#define NO_SLOT UINT32_MAX

/* What a sink put in the response buffer, so that a callback's status can
 * be checked against it (OK from get needs a value, CONFLICT a conflict). */
enum reply { REPLY_NONE, REPLY_VALUE, REPLY_CONFLICT, REPLY_PARTS };

struct engram_call {
    engram_instance *in;
    uint32_t op;
    int64_t deadline;
    enum reply reply;
    size_t nops;       /* COMMIT: ops in the batch */
    size_t parts;      /* PARTITIONS: ranges added */
    bool parts_failed; /* PARTITIONS: an add failed (message set) */
    bool has_msg;
    size_t msg_len;
    char msg[MSG_CAP];
};

struct engram_batch {
    engram_instance *in;
    size_t want;   /* pairs this batch may hold */
    size_t count;  /* pairs taken */
    size_t budget; /* bytes left under max_response */
    bool full;     /* a pair was refused: stop asking */
    bool too_big;  /* ...and it could not fit even an empty batch */
    bool oom;
    size_t big;    /* its size, for the message */
};

typedef struct scan_slot {
    uint64_t id; /* 0 = free */
    void *scan;
    uint64_t remaining; /* pairs the scan may still yield, if limited */
    bool limited;
    uint32_t next_free;
} scan_slot;

struct engram_instance {
    const engram_plugin *vt;
    void *self;
    const char *broken; /* why the vtable cannot be served, or NULL */
    bool ready, closed;
    uint32_t max_resp;
    uint32_t max_scan_batch;

    uint8_t *req; /* the request buffer (kvp_buffer) */
    size_t req_cap;
    engram_buf resp;
    size_t resp_off; /* the response starts at resp.ptr + resp_off */
    engram_call call;

    engram_op *ops; /* decoded COMMIT ops, reused */
    size_t ops_cap;
    uint32_t *dup_slots; /* duplicate-key finder, reused */
    uint64_t *dup_hash;
    size_t dup_cap;

    scan_slot *scans;
    uint32_t nscans; /* slots ever used */
    uint32_t slots_cap;
    uint32_t free_slot;
    uint64_t scan_seq;
};

/* The response of last resort, when even an error cannot be encoded. */
static const uint8_t oom_response[] = {ENGRAM_INTERNAL, 13, 'o', 'u', 't', ' ', 'o',
                                       'f', ' ', 'm', 'e', 'm', 'o', 'r', 'y'};

engram_instance *engram_instance_new(const engram_plugin *vt, void *self) {
    engram_instance *in = calloc(1, sizeof *in);
    if (!in) return NULL;
    in->vt = vt;
    in->self = self;
    in->max_resp = DEFAULT_MAX_RESPONSE;
    in->free_slot = NO_SLOT;
    in->call.in = in;
    if (!vt) in->broken = "engram_plugin_entry returned no vtable";
    else if (!vt->init) in->broken = "the vtable has no init";
    else if (!vt->get) in->broken = "the vtable has no get";
    else if (!vt->scan_open) in->broken = "the vtable has no scan_open";
    else if (!vt->scan_next) in->broken = "the vtable has no scan_next";
    else if (!vt->scan_close) in->broken = "the vtable has no scan_close";
    else if (!vt->commit) in->broken = "the vtable has no commit";
    else if (!vt->close) in->broken = "the vtable has no close";
    return in;
}

void engram_instance_free(engram_instance *in) {
    if (!in) return;
    free(in->req);
    engram_buf_free(&in->resp);
    free(in->ops);
    free(in->dup_slots);
    free(in->dup_hash);
    free(in->scans);
    free(in);
}

uint8_t *engram_instance_buffer(engram_instance *in, size_t min_cap) {
    if (in->req && min_cap <= in->req_cap) return in->req;
    size_t cap = in->req_cap > SIZE_MAX / 2 ? SIZE_MAX : 2 * in->req_cap;
    if (cap < min_cap) cap = min_cap;
    if (cap < MIN_REQUEST_BUFFER) cap = MIN_REQUEST_BUFFER;
    /* The host rewrites the buffer after asking: nothing to preserve, so
     * free and malloc rather than realloc's copy. */
    free(in->req);
    in->req = malloc(cap);
    in->req_cap = in->req ? cap : 0;
    return in->req;
}

int64_t engram_call_deadline(const engram_call *call) { return call->deadline; }

static void set_msgv(engram_call *c, const char *fmt, va_list ap) ENGRAM_PRINTF(2, 0);
static void set_msgv(engram_call *c, const char *fmt, va_list ap) {
    int n = vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    c->msg_len = n < 0 ? 0 : (size_t)n < sizeof c->msg ? (size_t)n : sizeof c->msg - 1;
    c->has_msg = true;
}

engram_status engram_fail(engram_call *c, engram_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_msgv(c, fmt, ap);
    va_end(ap);
    return st;
}

/* Encodes the error response st with the call's message (or a default),
 * trimmed so that the response fits max_response. */
static void put_error(engram_instance *in, engram_status st) {
    engram_call *c = &in->call;
    if (!c->has_msg) {
        int n = snprintf(c->msg, sizeof c->msg, "%s: %s", engram_op_name((int)c->op),
                         engram_status_name((int)st));
        c->msg_len = n < 0 ? 0 : (size_t)n;
    }
    size_t len = c->msg_len;
    size_t room = in->max_resp > 12 ? in->max_resp - 1 - engram_uvarint_len(in->max_resp) : 0;
    if (len > room) len = room;
    in->resp.len = in->resp_off = 0;
    engram_bytes msg = {(const uint8_t *)c->msg, len};
    if (!engram_encode_error(&in->resp, st, msg)) in->resp.len = 0;
}

static void fail(engram_instance *in, engram_status st, const char *fmt, ...) ENGRAM_PRINTF(3, 4);
static void fail(engram_instance *in, engram_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_msgv(&in->call, fmt, ap);
    va_end(ap);
    put_error(in, st);
}

/* refused answers a request that e says is malformed, and reports whether
 * it was. */
static bool refused(engram_instance *in, engram_err e) {
    if (e == ENGRAM_E_OK) return false;
    fail(in, ENGRAM_INVALID, "%s: malformed request: %s", engram_op_name((int)in->call.op),
         engram_err_str(e));
    return true;
}

static void put_ok(engram_instance *in) {
    in->resp.len = in->resp_off = 0;
    if (!engram_encode_status(&in->resp, ENGRAM_OK)) in->resp.len = 0;
}

/* Turns a callback's non-OK status into the response. A status the op may
 * not answer, a CONFLICT without its sink, or a code outside the ABI
 * becomes INTERNAL: the host would treat it as a protocol violation and
 * discard the instance. */
static void put_status(engram_instance *in, engram_status st) {
    engram_call *c = &in->call;
    const char *op = engram_op_name((int)c->op);
    if (!engram_status_allowed((int)c->op, (int)st)) {
        fail(in, ENGRAM_INTERNAL, "%s: the plugin returned status %d (%s), which %s cannot answer",
             op, (int)st, engram_status_name((int)st), op);
        return;
    }
    switch (st) {
    case ENGRAM_OK:
        put_ok(in);
        return;
    case ENGRAM_NOT_FOUND:
        in->resp.len = in->resp_off = 0;
        if (!engram_encode_status(&in->resp, st)) in->resp.len = 0;
        return;
    case ENGRAM_CONFLICT:
        if (c->reply != REPLY_CONFLICT)
            fail(in, ENGRAM_INTERNAL, "COMMIT: the plugin returned CONFLICT without engram_commit_conflict");
        return; /* the sink wrote it */
    default:
        put_error(in, st);
    }
}

static void do_init(engram_instance *in, const uint8_t *req, size_t len) {
    if (in->ready) {
        fail(in, ENGRAM_INVALID, "INIT sent twice");
        return;
    }
    engram_init_req m;
    if (refused(in, engram_decode_init_req(req, len, &m))) return;
    if (m.max_response > 0) in->max_resp = m.max_response;
    in->call.deadline = m.deadline;
    engram_init_info info = {m.config, m.instance, (m.host_flags & ENGRAM_HOST_FLAG_NET) != 0,
                             in->max_resp};
    engram_manifest man;
    memset(&man, 0, sizeof man);
    engram_status st = in->vt->init(in->self, &in->call, &info, &man);
    if (st != ENGRAM_OK) {
        put_status(in, st);
        return;
    }
    if (!man.name || !man.name[0]) {
        fail(in, ENGRAM_INTERNAL, "init: the manifest has no name");
        return;
    }
    if (man.model != ENGRAM_MODEL_SINGLE && man.model != ENGRAM_MODEL_POOLED) {
        fail(in, ENGRAM_INTERNAL, "init: manifest model %d is neither ENGRAM_MODEL_SINGLE nor ENGRAM_MODEL_POOLED",
             (int)man.model);
        return;
    }
    const char *version = man.version ? man.version : "";
    engram_wire_manifest w = {
        .name = {(const uint8_t *)man.name, strlen(man.name)},
        .version = {(const uint8_t *)version, strlen(version)},
        .abi_minor = ENGRAM_ABI_MINOR,
        .model = (uint8_t)man.model,
        .max_instances = man.model == ENGRAM_MODEL_SINGLE ? 1 : man.max_instances,
        .ops = ENGRAM_REQUIRED_OPS | 1u << ENGRAM_OP_IDLE,
        .features = (man.durable ? ENGRAM_FEATURE_DURABLE : 0) |
                    (man.native_ttl ? ENGRAM_FEATURE_NATIVE_TTL : 0),
        .max_commit_ops = man.max_commit_ops,
        .max_commit_bytes = man.max_commit_bytes,
        .max_scan_batch = man.max_scan_batch,
    };
    if (in->vt->partitions) {
        w.ops |= 1u << ENGRAM_OP_PARTITIONS;
        w.features |= ENGRAM_FEATURE_PARTITIONS;
    }
    if (in->vt->size) w.ops |= 1u << ENGRAM_OP_SIZE;
    if (in->vt->reclaim) w.ops |= 1u << ENGRAM_OP_RECLAIM;
    in->max_scan_batch = man.max_scan_batch;
    in->resp.len = 0;
    if (!engram_encode_manifest(&in->resp, &w)) {
        in->resp.len = 0;
        return;
    }
    in->ready = true;
}

engram_status engram_get_reply(engram_call *c, engram_bytes value) {
    engram_instance *in = c->in;
    if (c->op != ENGRAM_OP_GET)
        return engram_fail(c, ENGRAM_INTERNAL, "engram_get_reply called outside get");
    if (1 + bytes_len(value.len) > in->max_resp)
        return engram_fail(c, ENGRAM_INTERNAL, "a value of %zu bytes does not fit in the host's %u-byte response limit",
                           value.len, (unsigned)in->max_resp);
    in->resp.len = in->resp_off = 0;
    if (!engram_encode_value(&in->resp, value))
        return engram_fail(c, ENGRAM_INTERNAL, "out of memory replying with %zu bytes", value.len);
    c->reply = REPLY_VALUE;
    return ENGRAM_OK;
}

static void do_get(engram_instance *in, const uint8_t *req, size_t len) {
    engram_get_req m;
    if (refused(in, engram_decode_get_req(req, len, &m))) return;
    if (m.key.len == 0) {
        fail(in, ENGRAM_INVALID, "GET: empty key");
        return;
    }
    in->call.deadline = m.deadline;
    engram_status st = in->vt->get(in->self, &in->call, m.key);
    if (st == ENGRAM_OK && in->call.reply != REPLY_VALUE)
        fail(in, ENGRAM_INTERNAL, "GET: the plugin returned OK without engram_get_reply");
    else if (st != ENGRAM_OK)
        put_status(in, st);
}

/* ---- scans ---- */

static scan_slot *slot_find(engram_instance *in, uint64_t id) {
    uint64_t i = id & SLOT_MASK;
    if (id == 0 || i >= in->nscans || in->scans[i].id != id) return NULL;
    return &in->scans[i];
}

static scan_slot *slot_alloc(engram_instance *in) {
    uint32_t i = in->free_slot;
    if (i != NO_SLOT) {
        in->free_slot = in->scans[i].next_free;
    } else {
        if (in->nscans > SLOT_MASK) return NULL;
        if (in->nscans == in->slots_cap) {
            uint32_t cap = in->slots_cap ? 2 * in->slots_cap : 16;
            scan_slot *s = realloc(in->scans, cap * sizeof *s);
            if (!s) return NULL;
            in->scans = s;
            in->slots_cap = cap;
        }
        i = in->nscans++;
    }
    scan_slot *s = &in->scans[i];
    memset(s, 0, sizeof *s);
    s->id = ++in->scan_seq << SLOT_BITS | i;
    return s;
}

static void slot_free(engram_instance *in, scan_slot *s) {
    s->id = 0;
    s->scan = NULL;
    s->next_free = in->free_slot;
    in->free_slot = (uint32_t)(s - in->scans);
}

/* Releases an open scan: the plugin's state and the slot. */
static void scan_release(engram_instance *in, scan_slot *s) {
    in->vt->scan_close(in->self, s->scan);
    slot_free(in, s);
}

size_t engram_batch_want(const engram_batch *b) { return b->want - b->count; }

bool engram_scan_emit(engram_batch *b, engram_bytes key, engram_bytes value) {
    if (b->full || b->count >= b->want) {
        b->full = true;
        return false;
    }
    size_t n = bytes_len(key.len) + bytes_len(value.len);
    if (n > b->budget) {
        b->full = true;
        if (b->count == 0) {
            b->too_big = true;
            b->big = key.len + value.len;
        }
        return false;
    }
    engram_buf *r = &b->in->resp;
    /* One byte more than the pair: the batch's closing more flag always
     * has room, so finishing a batch cannot fail. */
    if (!engram_buf_reserve(r, n + 1)) {
        b->full = b->oom = true;
        return false;
    }
    uint8_t *p = r->ptr + r->len;
    p = put_bytes(p, key);
    p = put_bytes(p, value);
    r->len = (size_t)(p - r->ptr);
    b->budget -= n;
    b->count++;
    return true;
}

/* Builds the OK response of SCAN_OPEN (with_id) or SCAN_NEXT holding the
 * scan's next batch, asking scan_next until the batch is full or the scan
 * ends. A scan that ends (more = 0) is released at once, as ABI.md
 * promises the host; so is one that fails, with the error response. */
static void scan_batch(engram_instance *in, scan_slot *s, uint32_t batch_size, bool with_id) {
    engram_call *c = &in->call;
    in->resp.len = in->resp_off = 0;
    if (!engram_buf_reserve(&in->resp, SCAN_HEAD + 1)) {
        scan_release(in, s);
        in->resp.len = 0;
        return;
    }
    in->resp.len = SCAN_HEAD;
    size_t want = batch_size ? batch_size : DEFAULT_BATCH;
    if (in->max_scan_batch && want > in->max_scan_batch) want = in->max_scan_batch;
    if (s->limited && want > s->remaining) want = (size_t)s->remaining;
    engram_batch b = {in, want, 0, in->max_resp > SCAN_HEAD + 1 ? in->max_resp - SCAN_HEAD - 1 : 0,
                      false, false, false, 0};
    bool exhausted = want == 0;
    while (b.count < b.want && !b.full) {
        size_t before = b.count;
        engram_status st = in->vt->scan_next(in->self, c, s->scan, &b);
        if (st != ENGRAM_OK) {
            scan_release(in, s);
            put_status(in, st);
            return;
        }
        if (b.full) break;
        if (b.count == before) {
            exhausted = true;
            break;
        }
    }
    if (b.too_big || b.oom) {
        scan_release(in, s);
        if (b.oom)
            fail(in, ENGRAM_INTERNAL, "%s: out of memory building a batch", engram_op_name((int)c->op));
        else
            fail(in, ENGRAM_INTERNAL, "%s: a pair of %zu bytes does not fit in the host's %u-byte response limit",
                 engram_op_name((int)c->op), b.big, (unsigned)in->max_resp);
        return;
    }
    if (s->limited) s->remaining -= b.count;
    bool more = !exhausted && !(s->limited && s->remaining == 0);
    in->resp.ptr[in->resp.len++] = more ? 1 : 0; /* room kept by every reserve */

    uint8_t head[SCAN_HEAD], *p = head;
    *p++ = ENGRAM_OK;
    if (with_id) p = put_uv(p, s->id);
    p = put_uv(p, b.count);
    size_t hl = (size_t)(p - head);
    in->resp_off = SCAN_HEAD - hl;
    memcpy(in->resp.ptr + in->resp_off, head, hl);
    if (!more) scan_release(in, s);
}

static int compare_bytes(engram_bytes a, engram_bytes b) {
    size_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (c) return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

static void do_scan_open(engram_instance *in, const uint8_t *req, size_t len) {
    engram_scan_open_req m;
    if (refused(in, engram_decode_scan_open_req(req, len, &m))) return;
    in->call.deadline = m.deadline;
    if (m.end.len > 0 && compare_bytes(m.start, m.end) >= 0) {
        /* An empty range: answered without bothering the plugin. */
        in->resp.len = in->resp_off = 0;
        if (!engram_encode_scan_opened(&in->resp, 0, NULL, 0, false)) in->resp.len = 0;
        return;
    }
    scan_slot *s = slot_alloc(in);
    if (!s) {
        fail(in, ENGRAM_INTERNAL, "SCAN_OPEN: out of memory for scan slots");
        return;
    }
    engram_scan_options opts = {m.start, m.end, m.reverse, m.limit};
    void *scan = NULL;
    engram_status st = in->vt->scan_open(in->self, &in->call, &opts, &scan);
    if (st != ENGRAM_OK) {
        slot_free(in, s);
        put_status(in, st);
        return;
    }
    s->scan = scan;
    s->limited = m.limit > 0;
    s->remaining = m.limit;
    scan_batch(in, s, m.batch_size, true);
}

static void do_scan_next(engram_instance *in, const uint8_t *req, size_t len) {
    engram_scan_next_req m;
    if (refused(in, engram_decode_scan_next_req(req, len, &m))) return;
    scan_slot *s = slot_find(in, m.id);
    if (!s) {
        fail(in, ENGRAM_INVALID, "SCAN_NEXT: unknown scan id %llu", (unsigned long long)m.id);
        return;
    }
    in->call.deadline = m.deadline;
    scan_batch(in, s, m.batch_size, false);
}

static void do_scan_close(engram_instance *in, const uint8_t *req, size_t len) {
    engram_scan_close_req m;
    if (refused(in, engram_decode_scan_close_req(req, len, &m))) return;
    scan_slot *s = slot_find(in, m.id);
    if (s) scan_release(in, s); /* unknown ids are OK: idempotent */
    put_ok(in);
}

/* ---- commit ---- */

engram_status engram_commit_conflict(engram_call *c, size_t index, bool exists,
                                     engram_bytes current) {
    engram_instance *in = c->in;
    if (c->op != ENGRAM_OP_COMMIT)
        return engram_fail(c, ENGRAM_INTERNAL, "engram_commit_conflict called outside commit");
    if (index >= c->nops)
        return engram_fail(c, ENGRAM_INTERNAL, "COMMIT: conflict names op %zu of a %zu-op batch", index, c->nops);
    engram_conflict cf = {(uint32_t)index, exists, exists ? current : (engram_bytes){NULL, 0}};
    if (1 + 5 + 1 + bytes_len(cf.current.len) > in->max_resp)
        return engram_fail(c, ENGRAM_INTERNAL, "COMMIT: a conflicting value of %zu bytes does not fit in the response limit",
                           cf.current.len);
    in->resp.len = in->resp_off = 0;
    if (!engram_encode_conflict(&in->resp, &cf))
        return engram_fail(c, ENGRAM_INTERNAL, "COMMIT: out of memory reporting a conflict");
    c->reply = REPLY_CONFLICT;
    return ENGRAM_CONFLICT;
}

/* Mixes a key eight bytes at a time (multiply-xorshift, as splitmix64):
 * it only has to spread keys over the table; a collision costs a memcmp,
 * never a wrong answer. */
static uint64_t key_hash(engram_bytes k) {
    uint64_t h = UINT64_C(0x9e3779b97f4a7c15) ^ k.len;
    const uint8_t *p = k.ptr;
    size_t n = k.len;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * UINT64_C(0xbf58476d1ce4e5b9);
        h ^= h >> 31;
    }
    uint64_t t = 0;
    for (size_t i = 0; i < n; i++) t = t << 8 | p[i];
    h = (h ^ t) * UINT64_C(0x94d049bb133111eb);
    return h ^ h >> 29;
}

/* Returns the index of the first op whose key an earlier op named, -1 if
 * none, -2 when out of memory. Linear time with an open-addressing table of
 * hashes that is reused across calls: pairwise comparison is quadratic. */
static long find_dup(engram_instance *in, const engram_op *ops, size_t n) {
    if (n < 2) return -1;
    size_t size = 16;
    while (size < 2 * n) size *= 2;
    if (size > in->dup_cap) {
        uint32_t *s = malloc(size * sizeof *s);
        uint64_t *h = malloc(size * sizeof *h);
        if (!s || !h) {
            free(s);
            free(h);
            return -2;
        }
        free(in->dup_slots);
        free(in->dup_hash);
        in->dup_slots = s;
        in->dup_hash = h;
        in->dup_cap = size;
    }
    uint32_t *slots = in->dup_slots; /* 1 + op index; 0 = empty */
    memset(slots, 0, size * sizeof *slots);
    size_t mask = size - 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t h = key_hash(ops[i].key);
        for (size_t j = (size_t)h & mask;; j = (j + 1) & mask) {
            uint32_t k = slots[j];
            if (k == 0) {
                slots[j] = (uint32_t)i + 1;
                in->dup_hash[j] = h;
                break;
            }
            if (in->dup_hash[j] == h && compare_bytes(ops[k - 1].key, ops[i].key) == 0) return (long)i;
        }
    }
    return -1;
}

static void do_commit(engram_instance *in, const uint8_t *req, size_t len) {
    engram_commit_req m = {0, in->ops, 0};
    engram_err e = engram_decode_commit_req(req, len, &m, in->ops_cap);
    if (e == ENGRAM_E_ROOM) {
        size_t cap = in->ops_cap * 2 > m.count ? in->ops_cap * 2 : m.count;
        engram_op *ops = malloc(cap * sizeof *ops);
        if (!ops) {
            fail(in, ENGRAM_INTERNAL, "COMMIT: out of memory for %zu ops", m.count);
            return;
        }
        free(in->ops);
        in->ops = ops;
        in->ops_cap = cap;
        m.ops = ops;
        e = engram_decode_commit_req(req, len, &m, cap);
    }
    if (refused(in, e)) return;
    if (m.count == 0) {
        put_ok(in);
        return;
    }
    for (size_t i = 0; i < m.count; i++) {
        if (m.ops[i].key.len == 0) {
            fail(in, ENGRAM_INVALID, "COMMIT: op %zu: empty key", i);
            return;
        }
    }
    long dup = find_dup(in, m.ops, m.count);
    if (dup == -2) {
        fail(in, ENGRAM_INTERNAL, "COMMIT: out of memory checking keys");
        return;
    }
    if (dup >= 0) {
        fail(in, ENGRAM_INVALID, "COMMIT: op %ld: key appears twice in one batch", dup);
        return;
    }
    in->call.deadline = m.deadline;
    in->call.nops = m.count;
    engram_status st = in->vt->commit(in->self, &in->call, m.ops, m.count);
    put_status(in, st);
}

/* ---- partitions, close, idle ---- */

bool engram_partitions_add(engram_call *c, engram_bytes start, engram_bytes end) {
    engram_instance *in = c->in;
    if (c->op != ENGRAM_OP_PARTITIONS || c->reply != REPLY_PARTS) {
        engram_fail(c, ENGRAM_INTERNAL, "engram_partitions_add called outside partitions");
        return false;
    }
    if (c->parts_failed) return false;
    size_t n = bytes_len(start.len) + bytes_len(end.len);
    if (n > in->max_resp || in->resp.len + n > in->max_resp) {
        c->parts_failed = true;
        engram_fail(c, ENGRAM_INTERNAL, "PARTITIONS: %zu ranges exceed the host's %u-byte response limit",
                    c->parts + 1, (unsigned)in->max_resp);
        return false;
    }
    if (!engram_buf_reserve(&in->resp, n)) {
        c->parts_failed = true;
        engram_fail(c, ENGRAM_INTERNAL, "PARTITIONS: out of memory");
        return false;
    }
    uint8_t *p = in->resp.ptr + in->resp.len;
    p = put_bytes(p, start);
    p = put_bytes(p, end);
    in->resp.len = (size_t)(p - in->resp.ptr);
    c->parts++;
    return true;
}

static void do_partitions(engram_instance *in, const uint8_t *req, size_t len) {
    engram_partitions_req m;
    if (refused(in, engram_decode_partitions_req(req, len, &m))) return;
    if (!in->vt->partitions) {
        fail(in, ENGRAM_UNSUPPORTED, "PARTITIONS: the plugin has no partitions callback");
        return;
    }
    in->resp.len = in->resp_off = 0;
    if (!engram_buf_reserve(&in->resp, PARTS_HEAD)) return;
    in->resp.len = PARTS_HEAD;
    in->call.deadline = m.deadline;
    in->call.reply = REPLY_PARTS;
    engram_status st = in->vt->partitions(in->self, &in->call, m.start, m.end, m.max_parts);
    if (st == ENGRAM_OK && in->call.parts_failed) st = ENGRAM_INTERNAL;
    if (st != ENGRAM_OK) {
        put_status(in, st);
        return;
    }
    uint8_t head[PARTS_HEAD], *p = head;
    *p++ = ENGRAM_OK;
    p = put_uv(p, in->call.parts);
    size_t hl = (size_t)(p - head);
    in->resp_off = PARTS_HEAD - hl;
    memcpy(in->resp.ptr + in->resp_off, head, hl);
}

/* Decodes a request that is the header alone into the call's deadline;
 * false, with the INVALID response written, when it is malformed. */
static bool header_only(engram_instance *in, const uint8_t *req, size_t len) {
    engram_empty_req m;
    if (refused(in, engram_decode_empty_req(req, len, &m))) return false;
    in->call.deadline = m.deadline;
    return true;
}

static void do_close(engram_instance *in, const uint8_t *req, size_t len) {
    if (!header_only(in, req, len)) return;
    for (uint32_t i = 0; i < in->nscans; i++)
        if (in->scans[i].id) scan_release(in, &in->scans[i]);
    in->closed = true;
    put_status(in, in->vt->close(in->self, &in->call));
}

static void do_idle(engram_instance *in, const uint8_t *req, size_t len) {
    if (!header_only(in, req, len)) return;
    put_status(in, in->vt->idle ? in->vt->idle(in->self, &in->call) : ENGRAM_OK);
}

/* ---- size, reclaim (ABI 1.1) ---- */

static void do_size(engram_instance *in, const uint8_t *req, size_t len) {
    if (!header_only(in, req, len)) return;
    if (!in->vt->size) {
        fail(in, ENGRAM_UNSUPPORTED, "SIZE: the plugin has no size callback");
        return;
    }
    uint64_t bytes = 0;
    engram_status st = in->vt->size(in->self, &in->call, &bytes);
    if (st != ENGRAM_OK) {
        put_status(in, st);
        return;
    }
    if (bytes > (uint64_t)INT64_MAX) {
        /* The wire field is an i64: the host would refuse the response as
         * malformed and discard the instance. */
        fail(in, ENGRAM_INTERNAL, "SIZE: the plugin reported %llu bytes, over 2^63-1",
             (unsigned long long)bytes);
        return;
    }
    in->resp.len = in->resp_off = 0;
    if (!engram_encode_size(&in->resp, (int64_t)bytes)) in->resp.len = 0;
}

static void do_reclaim(engram_instance *in, const uint8_t *req, size_t len) {
    if (!header_only(in, req, len)) return;
    if (!in->vt->reclaim) {
        fail(in, ENGRAM_UNSUPPORTED, "RECLAIM: the plugin has no reclaim callback");
        return;
    }
    put_status(in, in->vt->reclaim(in->self, &in->call));
}

engram_bytes engram_instance_dispatch(engram_instance *in, uint32_t op, size_t len) {
    static const uint8_t empty[1];
    engram_call *c = &in->call;
    c->op = op;
    c->deadline = 0;
    c->reply = REPLY_NONE;
    c->nops = c->parts = 0;
    c->parts_failed = c->has_msg = false;
    in->resp.len = in->resp_off = 0;
    const uint8_t *req = in->req ? in->req : empty;

    if (len > in->req_cap)
        fail(in, ENGRAM_INVALID, "kvp_dispatch: request length %zu outside the %zu-byte buffer", len, in->req_cap);
    else if (in->broken)
        fail(in, ENGRAM_INTERNAL, "plugin cannot be served: %s", in->broken);
    else if (in->closed)
        fail(in, ENGRAM_INVALID, "instance is closed");
    else if (!in->ready && op != ENGRAM_OP_INIT)
        fail(in, ENGRAM_INVALID, "%s before INIT", engram_op_name((int)op));
    else {
        switch (op) {
        case ENGRAM_OP_INIT: do_init(in, req, len); break;
        case ENGRAM_OP_GET: do_get(in, req, len); break;
        case ENGRAM_OP_SCAN_OPEN: do_scan_open(in, req, len); break;
        case ENGRAM_OP_SCAN_NEXT: do_scan_next(in, req, len); break;
        case ENGRAM_OP_SCAN_CLOSE: do_scan_close(in, req, len); break;
        case ENGRAM_OP_COMMIT: do_commit(in, req, len); break;
        case ENGRAM_OP_PARTITIONS: do_partitions(in, req, len); break;
        case ENGRAM_OP_CLOSE: do_close(in, req, len); break;
        case ENGRAM_OP_IDLE: do_idle(in, req, len); break;
        case ENGRAM_OP_SIZE: do_size(in, req, len); break;
        case ENGRAM_OP_RECLAIM: do_reclaim(in, req, len); break;
        default: fail(in, ENGRAM_UNSUPPORTED, "op %u is not supported by this plugin", op);
        }
    }
    engram_bytes r = {in->resp.ptr + in->resp_off, in->resp.len - in->resp_off};
    if (r.len > in->max_resp) {
        /* Every sink checks its own size; this is the last line of
         * defence (a huge manifest) so the host never sees it. */
        fail(in, ENGRAM_INTERNAL, "%s: response of %zu bytes exceeds the host's %u-byte limit",
             engram_op_name((int)op), r.len, (unsigned)in->max_resp);
        r.ptr = in->resp.ptr;
        r.len = in->resp.len;
    }
    if (r.len == 0 || !in->resp.ptr) {
        r.ptr = oom_response;
        r.len = sizeof oom_response;
    }
    return r;
}

/* ======================================================================
 * Host imports
 * ==================================================================== */

#if defined(__wasm__)
#define HOST_IMPORT(name) __attribute__((import_module("engram_host_v1"), import_name(name)))
/* Pointers and sizes are i32 on wasm32, the signatures ABI.md gives. */
HOST_IMPORT("log") void engram_host_log(int32_t level, const void *ptr, size_t len);
HOST_IMPORT("clock_now") int64_t engram_host_clock_now(int32_t clock);
HOST_IMPORT("net_dial") int32_t engram_host_net_dial(const void *ptr, size_t len, int32_t timeout_ms);
HOST_IMPORT("net_read") int32_t engram_host_net_read(int32_t h, void *ptr, size_t len);
HOST_IMPORT("net_write") int32_t engram_host_net_write(int32_t h, const void *ptr, size_t len);
HOST_IMPORT("net_close") int32_t engram_host_net_close(int32_t h);
HOST_IMPORT("net_set_deadline") int32_t engram_host_net_set_deadline(int32_t h, int32_t which, int64_t unix_ns);
#else
/* Native stand-ins: a host that granted nothing. */
static void engram_host_log(int32_t level, const void *ptr, size_t len) {
    fprintf(stderr, "[plugin %d] %.*s\n", (int)level, (int)(len > INT32_MAX ? INT32_MAX : len), (const char *)ptr);
}
static int64_t engram_host_clock_now(int32_t clock) {
    struct timespec ts;
    if ((clock != ENGRAM_CLOCK_REALTIME && clock != ENGRAM_CLOCK_MONOTONIC) ||
        clock_gettime(clock == ENGRAM_CLOCK_REALTIME ? CLOCK_REALTIME : CLOCK_MONOTONIC, &ts) != 0)
        return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static int32_t engram_host_net_dial(const void *p, size_t n, int32_t t) {
    (void)p, (void)n, (void)t;
    return ENGRAM_NET_DENIED;
}
static int32_t engram_host_net_read(int32_t h, void *p, size_t n) {
    (void)h, (void)p, (void)n;
    return ENGRAM_NET_CLOSED;
}
static int32_t engram_host_net_write(int32_t h, const void *p, size_t n) {
    (void)h, (void)p, (void)n;
    return ENGRAM_NET_CLOSED;
}
static int32_t engram_host_net_close(int32_t h) {
    (void)h;
    return ENGRAM_NET_CLOSED;
}
static int32_t engram_host_net_set_deadline(int32_t h, int32_t w, int64_t ns) {
    (void)h, (void)w, (void)ns;
    return ENGRAM_NET_CLOSED;
}
#endif

/* The host takes i32 lengths; a larger request is served in part, as a
 * short read or write is allowed to be. */
static size_t clamp_len(size_t n) { return n > INT32_MAX ? INT32_MAX : n; }

void engram_log(int32_t level, const char *msg, size_t len) {
    engram_host_log(level, msg, clamp_len(len));
}

void engram_logf(int32_t level, const char *fmt, ...) {
    char buf[MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    engram_host_log(level, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

int64_t engram_clock_now(int32_t clock) { return engram_host_clock_now(clock); }

int32_t engram_net_dial(const char *addr, size_t len, int32_t timeout_ms) {
    return engram_host_net_dial(addr, clamp_len(len), timeout_ms);
}

int32_t engram_net_read(int32_t h, void *buf, size_t len) {
    return engram_host_net_read(h, buf, clamp_len(len));
}

int32_t engram_net_write(int32_t h, const void *buf, size_t len) {
    return engram_host_net_write(h, buf, clamp_len(len));
}

int32_t engram_net_write_all(int32_t h, const void *buf, size_t len) {
    const uint8_t *p = buf;
    while (len > 0) {
        int32_t n = engram_host_net_write(h, p, clamp_len(len));
        if (n < 0) return n;
        if (n == 0) return ENGRAM_NET_IO; /* the host promised progress */
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int32_t engram_net_close(int32_t h) { return engram_host_net_close(h); }

int32_t engram_net_set_deadline(int32_t h, int32_t which, int64_t unix_ns) {
    return engram_host_net_set_deadline(h, which, unix_ns);
}

const char *engram_net_strerror(int32_t code) {
    static const char *const names[] = {"DENIED", "REFUSED", "TIMEOUT", "EOF",
                                        "CLOSED", "INVALID", "LIMIT", "IO"};
    if (code >= 0) return "OK";
    if (code >= -8) return names[-code - 1];
    return "UNKNOWN";
}

/* ======================================================================
 * Exports (wasm only): one static instance, created on the host's first
 * call after _initialize, so engram_plugin_entry runs with libc ready.
 * ==================================================================== */

#if defined(__wasm__)
int32_t kvp_abi_version(void);
int32_t kvp_buffer(int32_t min_cap);
int64_t kvp_dispatch(int32_t op, int32_t req_len);

static engram_instance *the_instance;
static bool entry_called;

static engram_instance *instance(void) {
    if (!entry_called) {
        entry_called = true;
        void *self = NULL;
        const engram_plugin *vt = engram_plugin_entry(&self);
        the_instance = engram_instance_new(vt, self);
    }
    return the_instance;
}

__attribute__((export_name("kvp_abi_version"))) int32_t kvp_abi_version(void) {
    return ENGRAM_ABI_MAJOR;
}

__attribute__((export_name("kvp_buffer"))) int32_t kvp_buffer(int32_t min_cap) {
    engram_instance *in = instance();
    if (!in || min_cap < 0) return 0;
    uint8_t *buf = engram_instance_buffer(in, (size_t)min_cap);
    return (int32_t)(uintptr_t)buf;
}

__attribute__((export_name("kvp_dispatch"))) int64_t kvp_dispatch(int32_t op, int32_t req_len) {
    engram_instance *in = instance();
    engram_bytes r = {oom_response, sizeof oom_response};
    if (in) r = engram_instance_dispatch(in, (uint32_t)op, req_len < 0 ? SIZE_MAX : (size_t)req_len);
    return (int64_t)((uint64_t)(uintptr_t)r.ptr << 32 | (uint64_t)(uint32_t)r.len);
}
#endif
