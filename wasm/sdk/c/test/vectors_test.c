/*
 * vectors_test.c - checks the C codec against ABI.md's golden vectors.
 *
 * Usage: vectors_test PATH/TO/abi/testdata/vectors.json
 *
 * For every vector it decodes the bytes with the C decoder of its op and
 * direction, compares the decoded values with what the vector's note says
 * (for the vectors it knows), re-encodes them with the C encoder and
 * requires the very same bytes. It then derives malformed inputs from the
 * vector and requires each to be rejected: every truncation, a trailing
 * byte (accepted and ignored only by the extensible INIT messages), the
 * first varint in a longer, non-shortest form and in an 11-byte form, and
 * every element count raised beyond what the remaining bytes can hold.
 * Truncated inputs are copied into buffers of their exact size, so that
 * the sanitizers catch a decoder reading one byte too far. A few codec
 * checks that no vector covers (range of u32 and i64 fields, bools, op
 * kinds, scan flags, statuses) follow.
 *
 * It prints one line per vector and `vectors: N passed, M failed`, and
 * exits non-zero on any failure or if the file holds no vector. It owns no
 * production code: it must only call the public codec of engram_plugin.h.
 */
#include "../engram_plugin.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a JSON reader for the vectors file: an array of flat objects whose
 * values are strings ---- */

typedef struct vector {
    char *name, *op, *direction, *note, *hex;
} vector;

typedef struct parser {
    const char *s;
    size_t n, i;
} parser;

static void skip_ws(parser *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\n' || p->s[p->i] == '\r' || p->s[p->i] == '\t'))
        p->i++;
}

static bool expect(parser *p, char c) {
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == c) {
        p->i++;
        return true;
    }
    return false;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void put_utf8(char *out, size_t *o, unsigned cp) {
    if (cp < 0x80) {
        out[(*o)++] = (char)cp;
    } else if (cp < 0x800) {
        out[(*o)++] = (char)(0xc0 | cp >> 6);
        out[(*o)++] = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        out[(*o)++] = (char)(0xe0 | cp >> 12);
        out[(*o)++] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[(*o)++] = (char)(0x80 | (cp & 0x3f));
    } else {
        out[(*o)++] = (char)(0xf0 | cp >> 18);
        out[(*o)++] = (char)(0x80 | (cp >> 12 & 0x3f));
        out[(*o)++] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[(*o)++] = (char)(0x80 | (cp & 0x3f));
    }
}

static bool read_hex4(parser *p, unsigned *cp) {
    if (p->n - p->i < 4) return false;
    *cp = 0;
    for (int k = 0; k < 4; k++) {
        int v = hexval((unsigned char)p->s[p->i++]);
        if (v < 0) return false;
        *cp = *cp << 4 | (unsigned)v;
    }
    return true;
}

/* Parses a JSON string into a fresh NUL-terminated buffer, or NULL. */
static char *parse_string(parser *p) {
    if (!expect(p, '"')) return NULL;
    char *out = malloc(p->n - p->i + 1); /* unescaping never grows */
    if (!out) return NULL;
    size_t o = 0;
    while (p->i < p->n) {
        unsigned char c = (unsigned char)p->s[p->i++];
        if (c == '"') {
            out[o] = 0;
            return out;
        }
        if (c != '\\') {
            out[o++] = (char)c;
            continue;
        }
        if (p->i >= p->n) break;
        c = (unsigned char)p->s[p->i++];
        unsigned cp;
        switch (c) {
        case '"': case '\\': case '/': out[o++] = (char)c; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u':
            if (!read_hex4(p, &cp)) goto bad;
            if (cp >= 0xd800 && cp < 0xdc00) { /* a surrogate pair */
                unsigned lo;
                if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') goto bad;
                p->i += 2;
                if (!read_hex4(p, &lo) || lo < 0xdc00 || lo > 0xdfff) goto bad;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            put_utf8(out, &o, cp);
            break;
        default:
            goto bad;
        }
    }
bad:
    free(out);
    return NULL;
}

static void free_vector(vector *v) {
    free(v->name);
    free(v->op);
    free(v->direction);
    free(v->note);
    free(v->hex);
}

/* Parses the whole file; returns the number of vectors or -1. */
static long parse_vectors(const char *s, size_t n, vector **out) {
    parser p = {s, n, 0};
    size_t count = 0, cap = 0;
    vector *vs = NULL;
    if (!expect(&p, '[')) goto bad;
    if (expect(&p, ']')) goto done;
    do {
        if (!expect(&p, '{')) goto bad;
        vector v = {0};
        if (!expect(&p, '}')) {
            do {
                char *k = parse_string(&p);
                char *val = k && expect(&p, ':') ? parse_string(&p) : NULL;
                if (!val) {
                    free(k);
                    free_vector(&v);
                    goto bad;
                }
                char **slot = !strcmp(k, "name") ? &v.name : !strcmp(k, "op") ? &v.op
                            : !strcmp(k, "direction") ? &v.direction : !strcmp(k, "note") ? &v.note
                            : !strcmp(k, "hex") ? &v.hex : NULL;
                free(k);
                if (slot) {
                    free(*slot);
                    *slot = val;
                } else {
                    free(val); /* a field this test does not use */
                }
            } while (expect(&p, ','));
            if (!expect(&p, '}')) {
                free_vector(&v);
                goto bad;
            }
        }
        if (count == cap) {
            cap = cap ? 2 * cap : 32;
            vector *nv = realloc(vs, cap * sizeof *vs);
            if (!nv) {
                free_vector(&v);
                goto bad;
            }
            vs = nv;
        }
        vs[count++] = v;
    } while (expect(&p, ','));
    if (!expect(&p, ']')) goto bad;
done:
    skip_ws(&p);
    if (p.i != p.n) goto bad;
    *out = vs;
    return (long)count;
bad:
    for (size_t i = 0; i < count; i++) free_vector(&vs[i]);
    free(vs);
    return -1;
}

/* ---- describing decoded values ---- */

typedef struct text {
    char s[4096];
    size_t n;
} text;

static void tprintf(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tprintf(text *t, const char *fmt, ...) {
    if (t->n >= sizeof t->s) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->s + t->n, sizeof t->s - t->n, fmt, ap);
    va_end(ap);
    if (k > 0) t->n = t->n + (size_t)k < sizeof t->s ? t->n + (size_t)k : sizeof t->s - 1;
}

static void tbytes(text *t, engram_bytes b) {
    tprintf(t, "\"");
    for (size_t i = 0; i < b.len; i++) {
        uint8_t c = b.ptr[i];
        if (c == '"' || c == '\\') tprintf(t, "\\%c", c);
        else if (c >= 0x20 && c < 0x7f) tprintf(t, "%c", c);
        else tprintf(t, "\\x%02x", c);
    }
    tprintf(t, "\"");
}

static const char *kind_name(int k) {
    static const char *const n[] = {"?", "PUT", "DELETE", "PUT_IF_ABSENT", "CAS", "CAD"};
    return k >= 1 && k <= 5 ? n[k] : "?";
}

/* ---- decode, describe, re-encode ---- */

static int op_code(const char *name) {
    for (int op = ENGRAM_OP_INIT; op <= ENGRAM_OP_RECLAIM; op++)
        if (!strcmp(name, engram_op_name(op))) return op;
    return -1;
}

/* Whether a message of op in this direction is extensible (ABI.md 4): the
 * INIT request and the manifest (INIT's OK body). */
static bool extensible(int op, bool request, const uint8_t *b, size_t n) {
    return op == ENGRAM_OP_INIT && (request || (n > 0 && b[0] == ENGRAM_OK));
}

/* Decodes b as a message of op and direction, re-encodes it into out and
 * describes it into t. Returns the decoder's verdict; arrays are sized by
 * asking with no room first, which exercises ENGRAM_E_ROOM. */
static engram_err roundtrip(int op, bool request, const uint8_t *b, size_t n, engram_buf *out, text *t) {
    engram_err e = ENGRAM_E_OK;
    bool ok = true;
    out->len = 0;
    t->n = 0;
    t->s[0] = 0;
    if (request) {
        switch (op) {
        case ENGRAM_OP_INIT: {
            engram_init_req m;
            if ((e = engram_decode_init_req(b, n, &m))) return e;
            tprintf(t, "deadline=%lld config=", (long long)m.deadline);
            tbytes(t, m.config);
            tprintf(t, " host_flags=%llu instance=%u max_response=%u", (unsigned long long)m.host_flags,
                    m.instance, m.max_response);
            ok = engram_encode_init_req(out, &m);
            break;
        }
        case ENGRAM_OP_GET: {
            engram_get_req m;
            if ((e = engram_decode_get_req(b, n, &m))) return e;
            tprintf(t, "deadline=%lld key=", (long long)m.deadline);
            tbytes(t, m.key);
            ok = engram_encode_get_req(out, &m);
            break;
        }
        case ENGRAM_OP_SCAN_OPEN: {
            engram_scan_open_req m;
            if ((e = engram_decode_scan_open_req(b, n, &m))) return e;
            tprintf(t, "deadline=%lld start=", (long long)m.deadline);
            tbytes(t, m.start);
            tprintf(t, " end=");
            tbytes(t, m.end);
            tprintf(t, " reverse=%d limit=%llu batch_size=%u", m.reverse, (unsigned long long)m.limit, m.batch_size);
            ok = engram_encode_scan_open_req(out, &m);
            break;
        }
        case ENGRAM_OP_SCAN_NEXT: {
            engram_scan_next_req m;
            if ((e = engram_decode_scan_next_req(b, n, &m))) return e;
            tprintf(t, "deadline=%lld id=%llu batch_size=%u", (long long)m.deadline, (unsigned long long)m.id,
                    m.batch_size);
            ok = engram_encode_scan_next_req(out, &m);
            break;
        }
        case ENGRAM_OP_SCAN_CLOSE: {
            engram_scan_close_req m;
            if ((e = engram_decode_scan_close_req(b, n, &m))) return e;
            tprintf(t, "deadline=%lld id=%llu", (long long)m.deadline, (unsigned long long)m.id);
            ok = engram_encode_scan_close_req(out, &m);
            break;
        }
        case ENGRAM_OP_COMMIT: {
            engram_commit_req m = {0, NULL, 0};
            e = engram_decode_commit_req(b, n, &m, 0);
            if (e != ENGRAM_E_OK && e != ENGRAM_E_ROOM) return e;
            engram_op *ops = NULL;
            if (e == ENGRAM_E_ROOM) {
                size_t need = m.count;
                ops = malloc(need * sizeof *ops);
                if (!ops) return ENGRAM_E_ROOM;
                m.ops = ops;
                if ((e = engram_decode_commit_req(b, n, &m, need))) {
                    free(ops);
                    return e;
                }
            }
            tprintf(t, "deadline=%lld count=%zu", (long long)m.deadline, m.count);
            for (size_t i = 0; i < m.count; i++) {
                const engram_op *o = &m.ops[i];
                tprintf(t, " %s ", kind_name((int)o->kind));
                tbytes(t, o->key);
                if (o->kind == ENGRAM_COMPARE_AND_SWAP || o->kind == ENGRAM_COMPARE_AND_DELETE) {
                    tprintf(t, " expected=");
                    tbytes(t, o->expected);
                }
                if (o->kind == ENGRAM_PUT || o->kind == ENGRAM_PUT_IF_ABSENT || o->kind == ENGRAM_COMPARE_AND_SWAP) {
                    tprintf(t, " value=");
                    tbytes(t, o->value);
                }
            }
            ok = engram_encode_commit_req(out, &m);
            free(ops);
            break;
        }
        case ENGRAM_OP_PARTITIONS: {
            engram_partitions_req m;
            if ((e = engram_decode_partitions_req(b, n, &m))) return e;
            tprintf(t, "deadline=%lld start=", (long long)m.deadline);
            tbytes(t, m.start);
            tprintf(t, " end=");
            tbytes(t, m.end);
            tprintf(t, " max_parts=%u", m.max_parts);
            ok = engram_encode_partitions_req(out, &m);
            break;
        }
        case ENGRAM_OP_CLOSE:
        case ENGRAM_OP_IDLE:
        case ENGRAM_OP_SIZE:
        case ENGRAM_OP_RECLAIM: {
            engram_empty_req m;
            if ((e = engram_decode_empty_req(b, n, &m))) return e;
            tprintf(t, "deadline=%lld", (long long)m.deadline);
            ok = engram_encode_empty_req(out, &m);
            break;
        }
        default:
            return ENGRAM_E_BAD_VALUE;
        }
        return ok ? ENGRAM_E_OK : ENGRAM_E_ROOM;
    }

    int st;
    const uint8_t *body;
    size_t bn;
    if ((e = engram_split_response(b, n, &st, &body, &bn))) return e;
    if (!engram_status_allowed(op, st)) return ENGRAM_E_BAD_VALUE;
    tprintf(t, "%s", engram_status_name(st));
    if (st == ENGRAM_NOT_FOUND) {
        if ((e = engram_decode_empty(body, bn))) return e;
        ok = engram_encode_status(out, ENGRAM_NOT_FOUND);
    } else if (st == ENGRAM_CONFLICT) {
        engram_conflict c;
        if ((e = engram_decode_conflict(body, bn, &c))) return e;
        tprintf(t, " index=%u exists=%d current=", c.index, c.exists);
        tbytes(t, c.current);
        ok = engram_encode_conflict(out, &c);
    } else if (st != ENGRAM_OK) {
        engram_bytes msg;
        if ((e = engram_decode_message(body, bn, &msg))) return e;
        tprintf(t, " message=");
        tbytes(t, msg);
        ok = engram_encode_error(out, (engram_status)st, msg);
    } else {
        switch (op) {
        case ENGRAM_OP_INIT: {
            engram_wire_manifest m;
            if ((e = engram_decode_manifest(body, bn, &m))) return e;
            tprintf(t, " name=");
            tbytes(t, m.name);
            tprintf(t, " version=");
            tbytes(t, m.version);
            tprintf(t, " abi_minor=%u model=%u max_instances=%u ops=0x%llx features=0x%llx max_commit_ops=%u "
                       "max_commit_bytes=%u max_scan_batch=%u",
                    m.abi_minor, m.model, m.max_instances, (unsigned long long)m.ops,
                    (unsigned long long)m.features, m.max_commit_ops, m.max_commit_bytes, m.max_scan_batch);
            ok = engram_encode_manifest(out, &m);
            break;
        }
        case ENGRAM_OP_GET: {
            engram_bytes v;
            if ((e = engram_decode_value(body, bn, &v))) return e;
            tprintf(t, " value=");
            tbytes(t, v);
            ok = engram_encode_value(out, v);
            break;
        }
        case ENGRAM_OP_SCAN_OPEN:
        case ENGRAM_OP_SCAN_NEXT: {
            uint64_t id = 0;
            size_t count;
            bool more;
            engram_pair *pairs = NULL;
            for (size_t cap = 0;;) {
                e = op == ENGRAM_OP_SCAN_OPEN ? engram_decode_scan_opened(body, bn, &id, pairs, cap, &count, &more)
                                              : engram_decode_batch(body, bn, pairs, cap, &count, &more);
                if (e != ENGRAM_E_ROOM || cap > 0) break;
                cap = count;
                if (!(pairs = malloc(cap * sizeof *pairs))) return ENGRAM_E_ROOM;
            }
            if (e) {
                free(pairs);
                return e;
            }
            if (op == ENGRAM_OP_SCAN_OPEN) tprintf(t, " id=%llu", (unsigned long long)id);
            tprintf(t, " pairs=[");
            for (size_t i = 0; i < count; i++) {
                tprintf(t, i ? " " : "");
                tbytes(t, pairs[i].key);
                tprintf(t, "=");
                tbytes(t, pairs[i].value);
            }
            tprintf(t, "] more=%d", more);
            ok = op == ENGRAM_OP_SCAN_OPEN ? engram_encode_scan_opened(out, id, pairs, count, more)
                                           : engram_encode_batch(out, pairs, count, more);
            free(pairs);
            break;
        }
        case ENGRAM_OP_PARTITIONS: {
            size_t count;
            engram_range *r = NULL;
            for (size_t cap = 0;;) {
                e = engram_decode_partitions(body, bn, r, cap, &count);
                if (e != ENGRAM_E_ROOM || cap > 0) break;
                cap = count;
                if (!(r = malloc(cap * sizeof *r))) return ENGRAM_E_ROOM;
            }
            if (e) {
                free(r);
                return e;
            }
            tprintf(t, " ranges=[");
            for (size_t i = 0; i < count; i++) {
                tprintf(t, i ? " [" : "[");
                tbytes(t, r[i].start);
                tprintf(t, " ");
                tbytes(t, r[i].end);
                tprintf(t, ")");
            }
            tprintf(t, "]");
            ok = engram_encode_partitions(out, r, count);
            free(r);
            break;
        }
        case ENGRAM_OP_SIZE: {
            int64_t bytes;
            if ((e = engram_decode_size(body, bn, &bytes))) return e;
            tprintf(t, " bytes=%lld", (long long)bytes);
            ok = engram_encode_size(out, bytes);
            break;
        }
        default: /* SCAN_CLOSE, COMMIT, CLOSE, IDLE, RECLAIM: an empty OK */
            if ((e = engram_decode_empty(body, bn))) return e;
            ok = engram_encode_status(out, ENGRAM_OK);
        }
    }
    return ok ? ENGRAM_E_OK : ENGRAM_E_ROOM;
}

/* What each vector of wasm/abi/testdata/vectors.json means, restating its note
 * in the form roundtrip describes values. A vector not listed is still
 * round-tripped and attacked; it is reported as unchecked for values. */
static const struct {
    const char *name, *values;
} expected[] = {
    {"init-request", "deadline=1700000000000000000 config=\"dsn=x\" host_flags=1 instance=2 max_response=67108864"},
    {"get-request", "deadline=0 key=\"a\\x00\\xff\""},
    {"scan-open-request", "deadline=1 start=\"a\" end=\"b\" reverse=1 limit=300 batch_size=128"},
    {"scan-next-request", "deadline=0 id=7 batch_size=0"},
    {"scan-close-request", "deadline=0 id=200"},
    {"commit-request", "deadline=0 count=5 PUT \"k1\" value=\"v1\" DELETE \"k2\" PUT_IF_ABSENT \"k3\" value=\"\" "
                       "CAS \"k4\" expected=\"o\" value=\"n\" CAD \"k5\" expected=\"o\""},
    {"partitions-request", "deadline=0 start=\"\" end=\"z\" max_parts=4"},
    {"close-request", "deadline=0"},
    {"size-request", "deadline=1700000000000000000"},
    {"reclaim-request", "deadline=1700000000000000000"},
    {"init-response", "OK name=\"memkv\" version=\"1.0\" abi_minor=0 model=1 max_instances=1 ops=0x3fe "
                      "features=0x1 max_commit_ops=0 max_commit_bytes=0 max_scan_batch=1000"},
    {"init-response-abi-1.1", "OK name=\"memkv\" version=\"1.1\" abi_minor=1 model=1 max_instances=1 ops=0xffe "
                              "features=0x1 max_commit_ops=0 max_commit_bytes=0 max_scan_batch=1000"},
    {"get-response-ok", "OK value=\"hello\""},
    {"get-response-not-found", "NOT_FOUND"},
    {"scan-open-response", "OK id=1 pairs=[\"a\"=\"1\" \"b\"=\"\"] more=1"},
    {"scan-next-response-last", "OK pairs=[] more=0"},
    {"commit-response-conflict", "CONFLICT index=3 exists=1 current=\"cur\""},
    {"commit-response-uncertain", "UNCERTAIN message=\"timeout\""},
    {"partitions-response", "OK ranges=[[\"\" \"m\") [\"m\" \"\")]"},
    {"size-response", "OK bytes=5368709120"},
    {"reclaim-response-ok", "OK"},
    {"reclaim-response-deadline", "DEADLINE message=\"vacuum ran past the deadline\""},
};

/* ---- checking one vector ---- */

typedef struct check {
    const vector *v;
    int op;
    bool request;
    int failures;
    engram_buf out;
    text t;
    text values; /* the vector's decoded values, for its report line */
    bool unchecked; /* no expected values known for it */
} check;

static void failf(check *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failf(check *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("    FAIL %s: ", c->v->name ? c->v->name : "(unnamed)");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    c->failures++;
}

/* Runs roundtrip on an exact-size heap copy of b[0..n), so that reading
 * past the end is a sanitizer error rather than a silent success. */
static engram_err attempt(check *c, const uint8_t *b, size_t n) {
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy) return ENGRAM_E_ROOM;
    if (n) memcpy(copy, b, n);
    engram_err e = roundtrip(c->op, c->request, n ? copy : NULL, n, &c->out, &c->t);
    free(copy);
    return e;
}

/* Builds b with the varint at pos (of len bytes) replaced by rep[0..rn). */
static size_t splice(uint8_t *dst, const uint8_t *b, size_t n, size_t pos, size_t len, const uint8_t *rep, size_t rn) {
    memcpy(dst, b, pos);
    memcpy(dst + pos, rep, rn);
    memcpy(dst + pos + rn, b + pos + len, n - pos - len);
    return n - len + rn;
}

/* The offset of the element count of a message with one, or 0. */
static size_t count_offset(check *c, const uint8_t *b, size_t n) {
    uint64_t v;
    size_t used;
    if (c->request && c->op == ENGRAM_OP_COMMIT)
        return engram_get_uvarint(b, n, &v, &used) ? 0 : used;
    if (c->request || n < 2 || b[0] != ENGRAM_OK) return 0;
    if (c->op == ENGRAM_OP_SCAN_NEXT || c->op == ENGRAM_OP_PARTITIONS) return 1;
    if (c->op == ENGRAM_OP_SCAN_OPEN) return engram_get_uvarint(b + 1, n - 1, &v, &used) ? 0 : 1 + used;
    return 0;
}

static void check_vector(check *c, const uint8_t *b, size_t n) {
    const vector *v = c->v;
    /* 1. Decode and re-encode: the very same bytes. */
    engram_err e = attempt(c, b, n);
    if (e) {
        failf(c, "decode: %s", engram_err_str(e));
        return;
    }
    if (c->out.len != n || memcmp(c->out.ptr, b, n) != 0) failf(c, "re-encoding differs from the vector");
    const char *want = NULL;
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        if (!strcmp(expected[i].name, v->name)) want = expected[i].values;
    if (want && strcmp(want, c->t.s) != 0) failf(c, "decoded %s\n         want %s", c->t.s, want);
    c->values = c->t;
    c->unchecked = !want;

    uint8_t *m = malloc(n + 32);
    if (!m) {
        failf(c, "out of memory");
        return;
    }
    /* 2. Every truncation is malformed. */
    for (size_t k = 0; k < n; k++)
        if (attempt(c, b, k) == ENGRAM_E_OK) failf(c, "truncation to %zu of %zu bytes was accepted", k, n);

    /* 3. A trailing byte: refused by fixed layouts, ignored by extensible
     * messages (which then re-encode to the vector). */
    memcpy(m, b, n);
    m[n] = 0;
    e = attempt(c, m, n + 1);
    if (extensible(c->op, c->request, b, n)) {
        if (e != ENGRAM_E_OK) failf(c, "extensible message with a trailing byte refused: %s", engram_err_str(e));
        else if (c->out.len != n || memcmp(c->out.ptr, b, n) != 0) failf(c, "trailing byte changed the decoded values");
    } else if (e != ENGRAM_E_TRAILING) {
        failf(c, "trailing byte: got %s, want %s", engram_err_str(e), engram_err_str(ENGRAM_E_TRAILING));
    }

    /* 4. The first varint (the header of a request, the first field of a
     * response body) in a non-shortest form, and in an 11-byte form. */
    size_t pos = c->request ? 0 : 1, used = 0;
    uint64_t val;
    if (pos < n && engram_get_uvarint(b + pos, n - pos, &val, &used) == ENGRAM_E_OK) {
        if (used < 10) {
            uint8_t rep[11];
            memcpy(rep, b + pos, used);
            rep[used - 1] |= 0x80;
            rep[used] = 0x00;
            e = attempt(c, m, splice(m, b, n, pos, used, rep, used + 1));
            if (e != ENGRAM_E_NOT_SHORTEST)
                failf(c, "non-shortest varint at %zu: got %s", pos, engram_err_str(e));
        }
        static const uint8_t eleven[11] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01};
        e = attempt(c, m, splice(m, b, n, pos, used, eleven, sizeof eleven));
        if (e != ENGRAM_E_OVERFLOW) failf(c, "11-byte varint at %zu: got %s", pos, engram_err_str(e));
    }

    /* 5. A count larger than the remaining bytes can hold. */
    size_t at = count_offset(c, b, n);
    if (at > 0 && engram_get_uvarint(b + at, n - at, &val, &used) == ENGRAM_E_OK) {
        size_t rest = n - at - used;
        uint8_t rep[10];
        size_t rn = engram_put_uvarint(rep, rest + 1);
        e = attempt(c, m, splice(m, b, n, at, used, rep, rn));
        if (e != ENGRAM_E_COUNT) failf(c, "count %zu with %zu bytes left: got %s", rest + 1, rest, engram_err_str(e));
    }
    free(m);
}

/* ---- codec checks no vector covers ---- */

static int codec_failures, codec_checks;

static void expect_err(const char *what, engram_err got, engram_err want) {
    codec_checks++;
    if (got != want) {
        codec_failures++;
        printf("    FAIL codec: %s: got %s, want %s\n", what, engram_err_str(got), engram_err_str(want));
    }
}

static engram_err decode_hex_req(int op, const char *hex, engram_buf *out) {
    uint8_t b[64];
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(hexval(hex[2 * i]) << 4 | hexval(hex[2 * i + 1]));
    text t;
    return roundtrip(op, true, b, n, out, &t);
}

static engram_err decode_hex_resp(int op, const char *hex, engram_buf *out) {
    uint8_t b[64];
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(hexval(hex[2 * i]) << 4 | hexval(hex[2 * i + 1]));
    text t;
    return roundtrip(op, false, b, n, out, &t);
}

static void codec_checks_run(void) {
    static const uint64_t values[] = {0, 1, 127, 128, 16383, 16384, UINT32_MAX, (uint64_t)UINT32_MAX + 1,
                                      INT64_MAX, (uint64_t)INT64_MAX + 1, UINT64_MAX};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        uint8_t b[10];
        size_t n = engram_put_uvarint(b, values[i]), used;
        uint64_t got;
        engram_err e = engram_get_uvarint(b, n, &got, &used);
        codec_checks++;
        if (e || got != values[i] || used != n || n != engram_uvarint_len(values[i])) {
            codec_failures++;
            printf("    FAIL codec: varint %llu does not round-trip\n", (unsigned long long)values[i]);
        }
    }
    uint64_t v;
    size_t used;
    static const uint8_t max64[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    static const uint8_t over64[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02};
    static const uint8_t zero10[] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00};
    static const uint8_t cont[] = {0x80};
    expect_err("2^64-1 in 10 bytes", engram_get_uvarint(max64, sizeof max64, &v, &used), ENGRAM_E_OK);
    expect_err("65-bit varint", engram_get_uvarint(over64, sizeof over64, &v, &used), ENGRAM_E_OVERFLOW);
    expect_err("zero in 10 bytes", engram_get_uvarint(zero10, sizeof zero10, &v, &used), ENGRAM_E_NOT_SHORTEST);
    expect_err("varint cut after a continuation byte", engram_get_uvarint(cont, 1, &v, &used), ENGRAM_E_SHORT);
    expect_err("empty varint", engram_get_uvarint(NULL, 0, &v, &used), ENGRAM_E_SHORT);

    engram_buf out = {0};
    /* Field ranges: an i64 deadline of 2^63, a u32 batch size of 2^32. */
    expect_err("deadline 2^63", decode_hex_req(ENGRAM_OP_CLOSE, "80808080808080808001", &out), ENGRAM_E_OVERFLOW);
    expect_err("deadline 2^63-1", decode_hex_req(ENGRAM_OP_CLOSE, "ffffffffffffffff7f", &out), ENGRAM_E_OK);
    expect_err("batch_size 2^32", decode_hex_req(ENGRAM_OP_SCAN_NEXT, "00078080808010", &out), ENGRAM_E_OVERFLOW);
    expect_err("batch_size 2^32-1", decode_hex_req(ENGRAM_OP_SCAN_NEXT, "0007ffffffff0f", &out), ENGRAM_E_OK);
    expect_err("init instance 2^32", decode_hex_req(ENGRAM_OP_INIT, "0000008080808010" "00", &out), ENGRAM_E_OVERFLOW);
    /* Enumerations and flags. */
    expect_err("scan flag bit 1", decode_hex_req(ENGRAM_OP_SCAN_OPEN, "0001610162" "02" "0000", &out), ENGRAM_E_BAD_VALUE);
    expect_err("commit kind 0", decode_hex_req(ENGRAM_OP_COMMIT, "0001" "00" "016b", &out), ENGRAM_E_BAD_VALUE);
    expect_err("commit kind 6", decode_hex_req(ENGRAM_OP_COMMIT, "0001" "06" "016b", &out), ENGRAM_E_BAD_VALUE);
    expect_err("commit empty batch", decode_hex_req(ENGRAM_OP_COMMIT, "0000", &out), ENGRAM_E_OK);
    expect_err("conflict exists=2", decode_hex_resp(ENGRAM_OP_COMMIT, "02" "00" "02" "00", &out), ENGRAM_E_BAD_VALUE);
    expect_err("batch more=2", decode_hex_resp(ENGRAM_OP_SCAN_NEXT, "00" "00" "02", &out), ENGRAM_E_BAD_VALUE);
    expect_err("status 9", decode_hex_resp(ENGRAM_OP_GET, "09", &out), ENGRAM_E_BAD_VALUE);
    expect_err("NOT_FOUND for COMMIT", decode_hex_resp(ENGRAM_OP_COMMIT, "01", &out), ENGRAM_E_BAD_VALUE);
    expect_err("byte string longer than the message", decode_hex_req(ENGRAM_OP_GET, "00056162", &out), ENGRAM_E_SHORT);
    /* The manifest is extensible; an error response to INIT is not. */
    expect_err("INIT error with a trailing byte", decode_hex_resp(ENGRAM_OP_INIT, "08" "0161" "00", &out),
               ENGRAM_E_TRAILING);
    /* SIZE's byte count is an i64; RECLAIM's OK body is empty. */
    expect_err("size 2^63-1", decode_hex_resp(ENGRAM_OP_SIZE, "00" "ffffffffffffffff7f", &out), ENGRAM_E_OK);
    expect_err("size 2^63", decode_hex_resp(ENGRAM_OP_SIZE, "00" "80808080808080808001", &out), ENGRAM_E_OVERFLOW);
    expect_err("size without its count", decode_hex_resp(ENGRAM_OP_SIZE, "00", &out), ENGRAM_E_SHORT);
    expect_err("NOT_FOUND for SIZE", decode_hex_resp(ENGRAM_OP_SIZE, "01", &out), ENGRAM_E_BAD_VALUE);
    expect_err("UNCERTAIN for RECLAIM", decode_hex_resp(ENGRAM_OP_RECLAIM, "03" "00", &out), ENGRAM_E_BAD_VALUE);
    expect_err("RECLAIM OK with a body", decode_hex_resp(ENGRAM_OP_RECLAIM, "00" "00", &out), ENGRAM_E_TRAILING);
    expect_err("SIZE request with a body", decode_hex_req(ENGRAM_OP_SIZE, "00" "00", &out), ENGRAM_E_TRAILING);
    engram_buf_free(&out);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s wasm/abi/testdata/vectors.json\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    char *data = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            char *d = realloc(data, cap);
            if (!d) {
                fprintf(stderr, "out of memory\n");
                return 2;
            }
            data = d;
        }
        size_t k = fread(data + len, 1, cap - len, f);
        if (k == 0) break;
        len += k;
    }
    fclose(f);
    vector *vs = NULL;
    long count = parse_vectors(data, len, &vs);
    free(data);
    if (count < 0) {
        fprintf(stderr, "%s: not an array of objects of strings\n", argv[1]);
        return 2;
    }

    int passed = 0, failed = 0;
    for (long i = 0; i < count; i++) {
        check c = {.v = &vs[i]};
        const char *why = NULL;
        uint8_t *b = NULL;
        size_t n = 0;
        if (!c.v->name || !c.v->op || !c.v->direction || !c.v->hex) {
            why = "missing name, op, direction or hex";
        } else if ((c.op = op_code(c.v->op)) < 0) {
            why = "unknown op";
        } else if (strcmp(c.v->direction, "request") && strcmp(c.v->direction, "response")) {
            why = "direction is neither request nor response";
        } else {
            c.request = !strcmp(c.v->direction, "request");
            size_t hl = strlen(c.v->hex);
            n = hl / 2;
            b = malloc(n ? n : 1);
            if (!b || hl % 2) why = "bad hex";
            for (size_t k = 0; !why && k < n; k++) {
                int hi = hexval(c.v->hex[2 * k]), lo = hexval(c.v->hex[2 * k + 1]);
                if (hi < 0 || lo < 0) why = "bad hex";
                else b[k] = (uint8_t)(hi << 4 | lo);
            }
        }
        if (why) failf(&c, "%s", why);
        else check_vector(&c, b, n);
        printf("%s %-26s %-10s %-8s %3zu bytes  %s%s\n", c.failures ? "FAIL" : "ok  ",
               c.v->name ? c.v->name : "(unnamed)", c.v->op ? c.v->op : "?",
               c.v->direction ? c.v->direction : "?", n, c.values.s,
               c.unchecked ? " (values unchecked: round-trip only)" : "");
        if (c.failures) failed++;
        else passed++;
        free(b);
        engram_buf_free(&c.out);
        free_vector(&vs[i]);
    }
    free(vs);

    codec_checks_run();
    printf("codec: %d passed, %d failed\n", codec_checks - codec_failures, codec_failures);
    printf("vectors: %d passed, %d failed\n", passed, failed);
    if (count == 0) fprintf(stderr, "no vectors in %s\n", argv[1]);
    return failed || codec_failures || count == 0 ? 1 : 0;
}
