/*
 * memkv.c - an ordered in-memory key-value store as an Engram storage
 * plugin written in C (instance model single: the data lives in the
 * instance's linear memory and is lost with it).
 *
 * It owns the data structure and nothing of the ABI: requests, responses,
 * batching and the structural checks of COMMIT are the SDK's
 * (engram_plugin.h). It is the C SDK's example and must stay obviously
 * correct: it must pass `engram plugin verify` in full.
 *
 * Structure. A skip list orders the keys (O(log n) expected search, insert
 * and delete; level 0 is doubly linked so reverse scans step back in O(1)),
 * and a hash index finds a key's node for GET and commits in O(1): a skip
 * list search is a chain of cache misses (about 0.5 us at 10,000 keys,
 * natively), a probe is one or two.
 * Each key holds a chain of versions, newest first, each stamped with the
 * sequence number of the commit that wrote it; a delete writes a
 * tombstone. Every commit gets the next sequence number, so:
 *   - a scan reads the snapshot of the sequence current when it opened: for
 *     each key, the newest version not newer than that. Later commits are
 *     invisible to it, and a commit is all visible or not at all;
 *   - GET and conditions read the newest version.
 * Invariants:
 *   I1 a version is kept only while something can read it: the newest one
 *      of its key, or the one an open scan's snapshot sees (prune);
 *   I2 a key left with no version or a lone tombstone is unlinked: at once,
 *      or by the next gc pass if it is on the gc list;
 *   I3 a key that keeps old versions or a tombstone for the sake of open
 *      scans is on the gc list, which is processed when the last scan
 *      closes (then it empties: no scans, nothing old to keep), at IDLE,
 *      and when it has doubled since the last pass (amortised O(1) a write);
 *   I4 the index holds exactly the linked nodes;
 *   I5 scans never hold a node across calls unless no node was freed
 *      since (the store's epoch); otherwise they seek again from the last
 *      key they emitted, so unlinking a node is always safe.
 * A commit first checks every condition and allocates everything it will
 * link, then applies: running out of memory fails it with nothing applied.
 *
 * Size and reclaim (ABI 1.1). SIZE answers the bytes of keys and values
 * held, old versions kept for scans included: a running count, kept by
 * whatever links or frees a node or a version, so SIZE is O(1). RECLAIM
 * does what a memory store can: collect old versions no scan reads (as
 * IDLE does), shrink the hash index to fit the keys left (deletes never
 * shrink it) and free the pool of closed scans. What it frees returns to
 * malloc for later writes; a wasm instance's memory never shrinks, so the
 * host sees no change in the instance's footprint, and SIZE, which counts
 * data rather than memory, changes only by the versions collected.
 */
#include "engram_plugin.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_LEVEL = 24, PART_SIZE = 512 };

typedef struct version {
    struct version *older;
    uint64_t seq; /* the commit that wrote it */
    uint32_t len;
    bool tomb;
    uint8_t data[];
} version;

typedef struct node {
    version *head;     /* newest first; never NULL while linked */
    struct node *prev; /* level-0 predecessor; the sentinel for the first */
    uint32_t klen;
    uint8_t level;
    bool dirty;          /* on the gc list (I3) */
    struct node *next[]; /* level pointers; the key bytes follow them */
} node;

static const uint8_t *key_of(const node *x) { return (const uint8_t *)&x->next[x->level]; }

/* Open snapshots: sequence numbers ascending, with how many scans read
 * each. Scans open at the current sequence, so appends keep the order. */
typedef struct snap {
    uint64_t seq;
    uint32_t refs;
} snap;

typedef struct scan {
    struct scan *next_free;
    uint64_t seq; /* the snapshot */
    bool reverse, done, emitted, have_pos;
    node *pos;      /* next node to examine, if have_pos and epoch matches */
    uint64_t epoch; /* the store's epoch when pos was saved */
    uint8_t *bounds; /* [start][end], owned */
    size_t slen, elen, bcap;
    uint8_t *last; /* the last key emitted, owned, for seeking again */
    size_t last_len, last_cap;
} scan;

/* A slot of the hash index: a linked node and its key's hash. */
typedef struct islot {
    node *x; /* NULL = empty */
    uint64_t hash;
} islot;

/* One op of a commit being applied: everything allocated in advance. */
typedef struct prep {
    node *x;     /* the key's node, or NULL if it must be linked */
    node *fresh; /* the node to link, for a new key */
    version *v;  /* the version to push, or NULL: nothing to do */
} prep;

typedef struct store {
    node *head; /* sentinel with MAX_LEVEL levels; empty key */
    node *tail; /* last node, or head when empty */
    int level;
    islot *idx; /* open addressing, linear probing, at most half full */
    size_t idx_cap, idx_count;
    uint64_t rng;
    uint64_t seq;   /* last committed sequence */
    uint64_t epoch; /* bumped whenever a node is freed (I5) */
    uint64_t bytes; /* keys and values held: SIZE's answer */
    snap *snaps;
    size_t nsnaps, snaps_cap;
    node **gc;
    size_t ngc, gc_cap, gc_mark;
    prep *prep;
    size_t prep_cap;
    scan *pool; /* closed scans, reused with their buffers */
} store;

static store the_store;

/* Byte-wise key order (memcmp's, shorter prefix first), eight bytes at a
 * time: wasi-libc's memcmp walks single bytes, and keys in one store tend
 * to share long prefixes, so this is most of a search's cost. */
static int cmp(const uint8_t *a, size_t al, const uint8_t *b, size_t bl) {
    size_t n = al < bl ? al : bl, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        if (x != y) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            x = __builtin_bswap64(x); /* the first byte must weigh most */
            y = __builtin_bswap64(y);
#endif
            return x < y ? -1 : 1;
        }
    }
    for (; i < n; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return (al > bl) - (al < bl);
}

static int cmp_node(const node *x, const uint8_t *k, size_t kl) { return cmp(key_of(x), x->klen, k, kl); }

/* Returns array p (of *cap elements of elem bytes) with room for need,
 * reallocated geometrically; NULL when out of memory, p being intact. */
static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap && p) return p;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(p, c * elem);
    if (q) *cap = c;
    return q;
}

/* ---- skip list ---- */

/* Returns the last node with key < k (the sentinel if none), filling
 * upd[i] with the last such node on every level when upd is not NULL. */
static node *pred_of(store *s, const uint8_t *k, size_t kl, node **upd) {
    node *x = s->head;
    for (int i = s->level - 1; i >= 0; i--) {
        while (x->next[i] && cmp_node(x->next[i], k, kl) < 0) x = x->next[i];
        if (upd) upd[i] = x;
    }
    return x;
}

/* Mixes a key eight bytes at a time (multiply-xorshift, as splitmix64). */
static uint64_t hash_key(const uint8_t *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15u ^ n;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9u;
        h ^= h >> 31;
    }
    uint64_t t = 0;
    while (n--) t = t << 8 | *p++;
    h = (h ^ t) * 0x94d049bb133111ebu;
    return h ^ h >> 29;
}

static node *find(store *s, engram_bytes k) {
    if (s->idx_count == 0) return NULL;
    uint64_t h = hash_key(k.ptr, k.len);
    size_t mask = s->idx_cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        node *x = s->idx[i].x;
        if (!x) return NULL;
        if (s->idx[i].hash == h && cmp_node(x, k.ptr, k.len) == 0) return x;
    }
}

static void index_put(store *s, node *x, uint64_t h) {
    size_t mask = s->idx_cap - 1, i = (size_t)h & mask;
    while (s->idx[i].x) i = (i + 1) & mask;
    s->idx[i] = (islot){x, h};
    s->idx_count++;
}

/* The table size for keys: at most half full, a power of two. */
static size_t index_cap_for(size_t keys) {
    size_t cap = 64;
    while (cap < 2 * keys) cap *= 2;
    return cap;
}

/* Moves the index to a table of cap slots; false (index intact) when out
 * of memory. */
static bool index_resize(store *s, size_t cap) {
    islot *old = s->idx;
    size_t old_cap = s->idx_cap;
    islot *idx = calloc(cap, sizeof *idx);
    if (!idx) return false;
    s->idx = idx;
    s->idx_cap = cap;
    s->idx_count = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].x) index_put(s, old[i].x, old[i].hash);
    free(old);
    return true;
}

/* Makes room for n more keys; the only allocation of the index, done
 * before a commit applies anything. */
static bool index_reserve(store *s, size_t n) {
    if (2 * (s->idx_count + n) <= s->idx_cap) return true;
    return index_resize(s, index_cap_for(s->idx_count + n));
}

/* Removes x, shifting later entries of its probe run back so that no
 * lookup stops early at the hole (no tombstones to accumulate). */
static void index_remove(store *s, node *x) {
    size_t mask = s->idx_cap - 1, i = (size_t)hash_key(key_of(x), x->klen) & mask;
    while (s->idx[i].x != x) i = (i + 1) & mask;
    for (size_t j = (i + 1) & mask; s->idx[j].x; j = (j + 1) & mask) {
        size_t home = (size_t)s->idx[j].hash & mask;
        /* Entry j may fill hole i unless its home lies in (i, j]. */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            s->idx[i] = s->idx[j];
            i = j;
        }
    }
    s->idx[i].x = NULL;
    s->idx_count--;
}

static int random_level(store *s) {
    int lvl = 1;
    for (;;) { /* xorshift64: p = 1/4 per level */
        s->rng ^= s->rng << 13;
        s->rng ^= s->rng >> 7;
        s->rng ^= s->rng << 17;
        if ((s->rng & 3) != 0 || lvl == MAX_LEVEL) return lvl;
        lvl++;
    }
}

static node *node_new(store *s, engram_bytes k) {
    int lvl = random_level(s);
    node *x = malloc(sizeof *x + (size_t)lvl * sizeof x->next[0] + k.len);
    if (!x) return NULL;
    memset(x, 0, sizeof *x + (size_t)lvl * sizeof x->next[0]);
    x->level = (uint8_t)lvl;
    x->klen = (uint32_t)k.len;
    memcpy((uint8_t *)&x->next[lvl], k.ptr, k.len); /* the key follows the levels */
    return x;
}

static void link_node(store *s, node *x) {
    node *upd[MAX_LEVEL];
    pred_of(s, key_of(x), x->klen, upd);
    for (int i = s->level; i < x->level; i++) upd[i] = s->head;
    if (x->level > s->level) s->level = x->level;
    for (int i = 0; i < x->level; i++) {
        x->next[i] = upd[i]->next[i];
        upd[i]->next[i] = x;
    }
    x->prev = upd[0];
    if (x->next[0]) x->next[0]->prev = x;
    else s->tail = x;
    index_put(s, x, hash_key(key_of(x), x->klen)); /* room reserved by the commit */
    s->bytes += x->klen;
}

/* Frees a chain of versions and returns the value bytes they held. */
static uint64_t free_versions(version *v) {
    uint64_t n = 0;
    while (v) {
        version *o = v->older;
        n += v->len;
        free(v);
        v = o;
    }
    return n;
}

static void unlink_free(store *s, node *x) {
    node *upd[MAX_LEVEL];
    pred_of(s, key_of(x), x->klen, upd);
    for (int i = 0; i < x->level; i++) upd[i]->next[i] = x->next[i];
    if (x->next[0]) x->next[0]->prev = x->prev;
    else s->tail = x->prev;
    while (s->level > 1 && !s->head->next[s->level - 1]) s->level--;
    index_remove(s, x);
    s->bytes -= x->klen + free_versions(x->head);
    free(x);
    s->epoch++; /* I5: saved scan positions may point at it */
}

/* ---- versions and garbage ---- */

/* Whether an open snapshot reads in [lo, hi): the only ones that see a
 * version written at lo and replaced at hi. */
static bool snap_in(const store *s, uint64_t lo, uint64_t hi) {
    size_t a = 0, b = s->nsnaps;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (s->snaps[m].seq < lo) a = m + 1;
        else b = m;
    }
    return a < s->nsnaps && s->snaps[a].seq < hi;
}

enum prune_result { CLEAN, DIRTY, REMOVE };

/* Drops the versions of x no snapshot can read (I1) and says what is
 * left: CLEAN (one live version), DIRTY (old versions or a tombstone kept
 * for scans: I3) or REMOVE (nothing anyone can read: I2). */
static enum prune_result prune(store *s, node *x) {
    version *w = x->head, **link = &w->older, *u;
    while ((u = *link)) {
        if (snap_in(s, u->seq, w->seq)) {
            w = u;
            link = &u->older;
        } else {
            *link = u->older;
            s->bytes -= u->len;
            free(u);
        }
    }
    if (x->head->tomb && !x->head->older) return REMOVE;
    return x->head->older || x->head->tomb ? DIRTY : CLEAN;
}

static void gc(store *s) {
    size_t j = 0;
    for (size_t i = 0; i < s->ngc; i++) {
        node *x = s->gc[i];
        switch (prune(s, x)) {
        case DIRTY: s->gc[j++] = x; break;
        case CLEAN: x->dirty = false; break;
        case REMOVE: unlink_free(s, x); break;
        }
    }
    s->ngc = s->gc_mark = j;
}

static void maybe_gc(store *s) {
    if (s->ngc > 0 && (s->nsnaps == 0 || s->ngc > 2 * s->gc_mark + 64)) gc(s);
}

/* The version snapshot seq reads, or NULL: the key did not exist then. */
static const version *visible(const node *x, uint64_t seq) {
    const version *v = x->head;
    while (v && v->seq > seq) v = v->older;
    return v;
}

/* ---- callbacks ---- */

/* Frees the closed scans kept for reuse. */
static void free_pool(store *s) {
    while (s->pool) {
        scan *sc = s->pool;
        s->pool = sc->next_free;
        free(sc->bounds);
        free(sc->last);
        free(sc);
    }
}

static void store_free(store *s) {
    if (s->head) {
        node *x = s->head->next[0];
        while (x) {
            node *n = x->next[0];
            free_versions(x->head);
            free(x);
            x = n;
        }
        free(s->head);
    }
    free_pool(s);
    free(s->idx);
    free(s->snaps);
    free(s->gc);
    free(s->prep);
    memset(s, 0, sizeof *s);
}

static bool is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static engram_status kv_init(void *self, engram_call *call, const engram_init_info *info, engram_manifest *m) {
    store *s = self;
    for (size_t i = 0; i < info->config.len; i++)
        if (!is_space(info->config.ptr[i]))
            return engram_fail(call, ENGRAM_INVALID, "memkv-c takes no configuration, got \"%.*s\"",
                               (int)(info->config.len > 200 ? 200 : info->config.len),
                               (const char *)info->config.ptr);
    store_free(s);
    s->head = calloc(1, sizeof *s->head + MAX_LEVEL * sizeof s->head->next[0]);
    if (!s->head) return engram_fail(call, ENGRAM_INTERNAL, "out of memory");
    s->head->level = MAX_LEVEL;
    s->head->head = NULL;
    s->tail = s->head;
    s->level = 1;
    s->rng = 0x9e3779b97f4a7c15u;
    m->name = "memkv-c";
    m->version = "1.1.0";
    m->model = ENGRAM_MODEL_SINGLE;
    return ENGRAM_OK;
}

static engram_status kv_get(void *self, engram_call *call, engram_bytes key) {
    node *x = find(self, key);
    if (!x || x->head->tomb) return ENGRAM_NOT_FOUND;
    engram_bytes v = {x->head->data, x->head->len};
    return engram_get_reply(call, v);
}

/* The bookkeeping a commit of n ops needs, reserved before it applies. */
static bool reserve_commit(store *s, size_t n) {
    prep *p = grow(s->prep, &s->prep_cap, n, sizeof *s->prep);
    if (!p) return false;
    s->prep = p;
    node **g = grow(s->gc, &s->gc_cap, s->ngc + n, sizeof *s->gc);
    if (!g) return false;
    s->gc = g;
    return index_reserve(s, n);
}

/* Frees what a failed commit prepared for ops [0, n). */
static void unprepare(store *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(s->prep[i].v);
        free(s->prep[i].fresh);
    }
}

static engram_status kv_commit(void *self, engram_call *call, const engram_op *ops, size_t n) {
    store *s = self;
    /* Reserve the bookkeeping first: once applying starts nothing fails. */
    if (!reserve_commit(s, n))
        return engram_fail(call, ENGRAM_INTERNAL, "out of memory");
    /* Check every condition in order (the lowest failing index is the one
     * to report) and allocate what each op will link. */
    size_t i;
    for (i = 0; i < n; i++) {
        const engram_op *op = &ops[i];
        prep *p = &s->prep[i];
        p->x = find(s, op->key);
        p->fresh = NULL;
        p->v = NULL;
        const version *cur = p->x ? p->x->head : NULL;
        bool exists = cur && !cur->tomb;
        bool ok = true;
        if (op->kind == ENGRAM_PUT_IF_ABSENT) ok = !exists;
        else if (op->kind == ENGRAM_COMPARE_AND_SWAP || op->kind == ENGRAM_COMPARE_AND_DELETE)
            ok = exists && cmp(cur->data, cur->len, op->expected.ptr, op->expected.len) == 0;
        if (!ok) {
            engram_bytes current = {exists ? cur->data : NULL, exists ? cur->len : 0};
            unprepare(s, i);
            return engram_commit_conflict(call, i, exists, current);
        }
        bool del = op->kind == ENGRAM_DELETE || op->kind == ENGRAM_COMPARE_AND_DELETE;
        if (del && !exists) continue; /* deleting an absent key changes nothing */
        size_t len = del ? 0 : op->value.len;
        p->v = malloc(sizeof *p->v + len);
        if (p->v && !p->x) p->fresh = node_new(s, op->key);
        if (!p->v || (!p->x && !p->fresh)) {
            unprepare(s, i + 1);
            return engram_fail(call, ENGRAM_INTERNAL, "out of memory for op %zu", i);
        }
        p->v->tomb = del;
        p->v->len = (uint32_t)len;
        if (len) memcpy(p->v->data, op->value.ptr, len);
    }
    /* Apply, all at one sequence number: a snapshot sees all or nothing. */
    uint64_t seq = ++s->seq;
    for (i = 0; i < n; i++) {
        prep *p = &s->prep[i];
        if (!p->v) continue;
        node *x = p->x;
        if (!x) {
            x = p->fresh;
            link_node(s, x);
        }
        p->v->seq = seq;
        p->v->older = x->head;
        x->head = p->v;
        s->bytes += p->v->len;
        switch (prune(s, x)) {
        case CLEAN: break;
        case DIRTY:
            if (!x->dirty) {
                x->dirty = true;
                s->gc[s->ngc++] = x; /* room reserved above */
            }
            break;
        case REMOVE:
            if (!x->dirty) unlink_free(s, x); /* else the gc list owns it */
            break;
        }
    }
    maybe_gc(s);
    return ENGRAM_OK;
}

static bool snap_add(store *s, uint64_t seq) {
    if (s->nsnaps > 0 && s->snaps[s->nsnaps - 1].seq == seq) {
        s->snaps[s->nsnaps - 1].refs++;
        return true;
    }
    snap *sn = grow(s->snaps, &s->snaps_cap, s->nsnaps + 1, sizeof *s->snaps);
    if (!sn) return false;
    s->snaps = sn;
    s->snaps[s->nsnaps++] = (snap){seq, 1};
    return true;
}

static void snap_remove(store *s, uint64_t seq) {
    size_t a = 0, b = s->nsnaps;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (s->snaps[m].seq < seq) a = m + 1;
        else b = m;
    }
    if (a == s->nsnaps || s->snaps[a].seq != seq) return;
    if (--s->snaps[a].refs == 0) {
        memmove(&s->snaps[a], &s->snaps[a + 1], (s->nsnaps - a - 1) * sizeof *s->snaps);
        s->nsnaps--;
    }
}

static engram_status kv_scan_open(void *self, engram_call *call, const engram_scan_options *o, void **out) {
    store *s = self;
    scan *sc = s->pool;
    if (sc) s->pool = sc->next_free;
    else if (!(sc = calloc(1, sizeof *sc))) return engram_fail(call, ENGRAM_INTERNAL, "out of memory");
    /* Never a NULL buffer, so bound pointers are always well formed. */
    size_t need = o->start.len + o->end.len + 1;
    if (need > sc->bcap) {
        uint8_t *b = malloc(need);
        if (!b) goto oom;
        free(sc->bounds);
        sc->bounds = b;
        sc->bcap = need;
    }
    if (!snap_add(s, s->seq)) goto oom;
    if (o->start.len) memcpy(sc->bounds, o->start.ptr, o->start.len);
    if (o->end.len) memcpy(sc->bounds + o->start.len, o->end.ptr, o->end.len);
    sc->slen = o->start.len;
    sc->elen = o->end.len;
    sc->seq = s->seq;
    sc->reverse = o->reverse;
    sc->done = sc->emitted = sc->have_pos = false;
    sc->last_len = 0;
    *out = sc;
    return ENGRAM_OK;
oom:
    sc->next_free = s->pool;
    s->pool = sc;
    return engram_fail(call, ENGRAM_INTERNAL, "out of memory");
}

/* Where the scan continues: its saved node if no node was freed since
 * (I5), else found again from the last key it emitted, or from its bound.
 * Forward: the first node to examine; reverse: likewise, walking back. */
static node *resume(store *s, scan *sc) {
    if (sc->have_pos && sc->epoch == s->epoch) return sc->pos;
    const uint8_t *start = sc->bounds, *end = sc->bounds + sc->slen;
    if (!sc->reverse) {
        if (!sc->emitted) return pred_of(s, start, sc->slen, NULL)->next[0];
        node *x = pred_of(s, sc->last, sc->last_len, NULL)->next[0];
        return x && cmp_node(x, sc->last, sc->last_len) == 0 ? x->next[0] : x;
    }
    if (sc->emitted) return pred_of(s, sc->last, sc->last_len, NULL);
    return sc->elen ? pred_of(s, end, sc->elen, NULL) : s->tail;
}

static engram_status kv_scan_next(void *self, engram_call *call, void *h, engram_batch *batch) {
    store *s = self;
    scan *sc = h;
    if (sc->done) return ENGRAM_OK;
    const uint8_t *start = sc->bounds, *end = sc->bounds + sc->slen;
    node *x = resume(s, sc), *last = NULL;
    for (;;) {
        if (sc->reverse ? x == s->head || cmp_node(x, start, sc->slen) < 0
                        : !x || (sc->elen && cmp_node(x, end, sc->elen) >= 0)) {
            sc->done = true;
            break;
        }
        const version *v = visible(x, sc->seq);
        if (v && !v->tomb) {
            engram_bytes k = {key_of(x), x->klen}, val = {v->data, v->len};
            if (!engram_scan_emit(batch, k, val)) break; /* full: x goes first next time */
            last = x;
        }
        x = sc->reverse ? x->prev : x->next[0];
    }
    sc->pos = x;
    sc->epoch = s->epoch;
    sc->have_pos = true;
    if (last) {
        if (last->klen > sc->last_cap) {
            uint8_t *b = malloc(last->klen);
            if (!b) return engram_fail(call, ENGRAM_INTERNAL, "out of memory");
            free(sc->last);
            sc->last = b;
            sc->last_cap = last->klen;
        }
        memcpy(sc->last, key_of(last), last->klen);
        sc->last_len = last->klen;
        sc->emitted = true;
    }
    return ENGRAM_OK;
}

static void kv_scan_close(void *self, void *h) {
    store *s = self;
    scan *sc = h;
    snap_remove(s, sc->seq);
    sc->next_free = s->pool;
    s->pool = sc;
    maybe_gc(s);
}

/* Cuts [start, end) every PART_SIZE live keys, so that the host's parallel
 * scans get more than one range on a large store. */
static engram_status kv_partitions(void *self, engram_call *call, engram_bytes start, engram_bytes end,
                                   uint32_t max_parts) {
    store *s = self;
    engram_bytes from = start;
    size_t parts = 1, n = 0;
    for (node *x = pred_of(s, start.ptr, start.len, NULL)->next[0]; x; x = x->next[0]) {
        if (end.len && cmp_node(x, end.ptr, end.len) >= 0) break;
        if (x->head->tomb) continue;
        if (n > 0 && n % PART_SIZE == 0 && (max_parts == 0 || parts < max_parts)) {
            engram_bytes cut = {key_of(x), x->klen};
            if (!engram_partitions_add(call, from, cut)) return ENGRAM_INTERNAL;
            from = cut;
            parts++;
        }
        n++;
    }
    return engram_partitions_add(call, from, end) ? ENGRAM_OK : ENGRAM_INTERNAL;
}

static engram_status kv_idle(void *self, engram_call *call) {
    (void)call;
    store *s = self;
    if (s->ngc > 0) gc(s);
    return ENGRAM_OK;
}

static engram_status kv_size(void *self, engram_call *call, uint64_t *bytes) {
    (void)call;
    const store *s = self;
    *bytes = s->bytes;
    return ENGRAM_OK;
}

/* See the file comment. One pass over the gc list and one rehash of the
 * keys: the cost of one growth of the index, bounded, since the host's
 * other calls wait for it. */
static engram_status kv_reclaim(void *self, engram_call *call) {
    (void)call;
    store *s = self;
    if (s->ngc > 0) gc(s);
    size_t cap = index_cap_for(s->idx_count);
    /* Out of memory keeps the larger table: nothing is lost, and the
     * answer is still OK, as reclaiming promises nothing. */
    if (cap < s->idx_cap) index_resize(s, cap);
    free_pool(s);
    return ENGRAM_OK;
}

static engram_status kv_close(void *self, engram_call *call) {
    (void)call;
    store_free(self);
    return ENGRAM_OK;
}

static const engram_plugin memkv = {
    .init = kv_init,
    .get = kv_get,
    .scan_open = kv_scan_open,
    .scan_next = kv_scan_next,
    .scan_close = kv_scan_close,
    .commit = kv_commit,
    .close = kv_close,
    .partitions = kv_partitions,
    .idle = kv_idle,
    .size = kv_size,
    .reclaim = kv_reclaim,
};

ENGRAM_PLUGIN(&memkv, &the_store)
