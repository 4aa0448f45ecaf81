/*
 * engram_plugin.h - the C SDK for Engram storage plugins (ABI 1.1).
 *
 * This header owns the plugin side of the ABI in ../../abi/ABI.md for C:
 *   1. the plugin API: a vtable of callbacks (engram_plugin), the per-call
 *      handle they receive (engram_call) and the sinks that write results
 *      straight into the response (engram_get_reply, engram_scan_emit, ...);
 *   2. the host imports of module engram_host_v1, with thin wrappers;
 *   3. the codec: every request and response of ABI.md, strict decoders and
 *      shortest-form encoders, usable on its own (the golden-vector test
 *      runs it natively).
 * It depends on nothing but the C standard library (wasi-libc in a plugin).
 * It must not grow a dependency, a global constructor, or an allocation on
 * the per-call path: whatever it does lands in every C plugin's binary and
 * in every call's cost.
 *
 * Writing a plugin
 * ----------------
 * Define the callbacks, put them in a const engram_plugin, and define the
 * one function the SDK calls to find them (or use ENGRAM_PLUGIN):
 *
 *     static const engram_plugin vtable = { .init = my_init, .get = my_get, ... };
 *     ENGRAM_PLUGIN(&vtable, &my_state)
 *
 * Build it as a WASI reactor:
 *
 *     clang --target=wasm32-wasi -mexec-model=reactor -O2 -mbulk-memory \
 *           -o my.wasm my.c engram_plugin.c
 *
 * The SDK exports kvp_abi_version, kvp_buffer and kvp_dispatch itself.
 * The host runs _initialize (wasi-libc's reactor start-up: C constructors)
 * once, then the SDK calls engram_plugin_entry once, on the host's first
 * call, before INIT. Nothing else runs at load time.
 *
 * Threading. The host calls an instance from one thread, one call at a
 * time; no callback ever runs concurrently with another, and nothing in the
 * instance runs between calls. A plugin needs no locks. Callbacks must not
 * call the kvp_* exports (no re-entrancy) and must not spin without a host
 * call: the host can only interrupt an overrunning guest at a host call.
 *
 * Instance models (ABI.md section 5), declared in the manifest:
 *   ENGRAM_MODEL_SINGLE - the data lives in the plugin's linear memory. The
 *     host runs exactly one instance and serialises every call through it;
 *     if it traps, the data is gone and the host stops serving the store.
 *   ENGRAM_MODEL_POOLED - the plugin is a stateless client of a remote
 *     store. The host runs N interchangeable instances (each its own memory,
 *     each INITed with the same config) and replaces crashed ones. A scan is
 *     always continued on the instance that opened it, so per-scan state
 *     (a remote cursor) may live in the instance.
 *
 * Ownership, in one rule: every pointer the SDK passes to a callback
 * (keys, values, bounds, the config, the ops array) aliases the SDK's
 * request buffer and is valid only until the callback returns; copy what
 * you keep. Every pointer a plugin passes to the SDK (to a sink, in the
 * manifest) is read before the sink or the callback returns; the SDK never
 * keeps it. Handles (engram_call, engram_batch) are valid only during the
 * callback that received them.
 */
#ifndef ENGRAM_PLUGIN_H
#define ENGRAM_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ENGRAM_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define ENGRAM_PRINTF(fmt, args)
#endif

/* ------------------------------------------------------------------------
 * Constants of the ABI
 * ---------------------------------------------------------------------- */

#define ENGRAM_ABI_MAJOR 1
#define ENGRAM_ABI_MINOR 1

/* Op codes of kvp_dispatch. */
typedef enum engram_op_code {
    ENGRAM_OP_INIT = 1,
    ENGRAM_OP_GET = 2,
    ENGRAM_OP_SCAN_OPEN = 3,
    ENGRAM_OP_SCAN_NEXT = 4,
    ENGRAM_OP_SCAN_CLOSE = 5,
    ENGRAM_OP_COMMIT = 6,
    ENGRAM_OP_PARTITIONS = 7,
    ENGRAM_OP_CLOSE = 8,
    ENGRAM_OP_IDLE = 9,
    ENGRAM_OP_SIZE = 10,    /* ABI 1.1 */
    ENGRAM_OP_RECLAIM = 11, /* ABI 1.1 */
} engram_op_code;

/* The ops every plugin must handle, as manifest ops bits. */
#define ENGRAM_REQUIRED_OPS                                                   \
    ((1u << ENGRAM_OP_INIT) | (1u << ENGRAM_OP_GET) |                         \
     (1u << ENGRAM_OP_SCAN_OPEN) | (1u << ENGRAM_OP_SCAN_NEXT) |              \
     (1u << ENGRAM_OP_SCAN_CLOSE) | (1u << ENGRAM_OP_COMMIT) |                \
     (1u << ENGRAM_OP_CLOSE))

/*
 * Return codes of every callback, and the status byte of every response:
 * the values are the ABI's. Which an op may answer (anything else is
 * turned into ENGRAM_INTERNAL by the SDK, so the host never sees a
 * protocol violation):
 *   ENGRAM_OK           every op;
 *   ENGRAM_NOT_FOUND    get only (the key is absent);
 *   ENGRAM_CONFLICT     commit only, and only through engram_commit_conflict;
 *   ENGRAM_UNCERTAIN    commit only: the outcome is unknown;
 *   ENGRAM_UNSUPPORTED, ENGRAM_INVALID (malformed or refused request; nothing
 *   applied), ENGRAM_UNAVAILABLE (engine unreachable now; nothing applied;
 *   retry may work), ENGRAM_DEADLINE (the deadline passed; nothing applied),
 *   ENGRAM_INTERNAL (anything else; nothing applied): every op.
 * A message for the non-OK statuses is set with engram_fail.
 */
typedef enum engram_status {
    ENGRAM_OK = 0,
    ENGRAM_NOT_FOUND = 1,
    ENGRAM_CONFLICT = 2,
    ENGRAM_UNCERTAIN = 3,
    ENGRAM_UNSUPPORTED = 4,
    ENGRAM_INVALID = 5,
    ENGRAM_UNAVAILABLE = 6,
    ENGRAM_DEADLINE = 7,
    ENGRAM_INTERNAL = 8,
} engram_status;

/* The instance model of the manifest (see the file comment). */
typedef enum engram_model {
    ENGRAM_MODEL_SINGLE = 1,
    ENGRAM_MODEL_POOLED = 2,
} engram_model;

/* Manifest feature bits. */
#define ENGRAM_FEATURE_PARTITIONS (1u << 0)
#define ENGRAM_FEATURE_DURABLE (1u << 1)
#define ENGRAM_FEATURE_NATIVE_TTL (1u << 2)

/* INIT host flag bits. */
#define ENGRAM_HOST_FLAG_NET (1u << 0)

/* SCAN_OPEN flag bits. */
#define ENGRAM_SCAN_REVERSE (1u << 0)

/* Kinds of COMMIT ops; the values are the ABI's. */
typedef enum engram_op_kind {
    ENGRAM_PUT = 1,                /* write value */
    ENGRAM_DELETE = 2,             /* remove key; absent is not an error */
    ENGRAM_PUT_IF_ABSENT = 3,      /* write value only if key is absent */
    ENGRAM_COMPARE_AND_SWAP = 4,   /* write value only if key holds expected */
    ENGRAM_COMPARE_AND_DELETE = 5, /* remove key only if it holds expected */
} engram_op_kind;

/* A byte string: ptr may be NULL when len is 0. Empty and absent are the
 * same (ABI.md 4). Who owns ptr is said wherever a slice is handed over. */
typedef struct engram_bytes {
    const uint8_t *ptr;
    size_t len;
} engram_bytes;

/* One write of a COMMIT. value is set for PUT, PUT_IF_ABSENT and
 * COMPARE_AND_SWAP, expected for COMPARE_AND_SWAP and COMPARE_AND_DELETE;
 * the other is empty. */
typedef struct engram_op {
    engram_op_kind kind;
    engram_bytes key;
    engram_bytes value;
    engram_bytes expected;
} engram_op;

/* ------------------------------------------------------------------------
 * The plugin API
 * ---------------------------------------------------------------------- */

/* The handle of the request being served: its deadline, its error message,
 * its response. Valid only during the callback that received it. */
typedef struct engram_call engram_call;

/* A scan batch being filled, passed to scan_next. Valid only during that
 * call. */
typedef struct engram_batch engram_batch;

/* What INIT tells the plugin. config aliases the request buffer: valid
 * only during init. */
typedef struct engram_init_info {
    engram_bytes config;   /* storage.wasm.config, verbatim */
    uint32_t instance;     /* index in the host's pool (0 for single) */
    bool net_allowed;      /* at least one address is allowed: dial may work */
    uint32_t max_response; /* the host's response cap; the SDK enforces it */
} engram_init_info;

/* What the plugin tells the host, filled by init (the SDK zeroes it first).
 * The strings are read before init's caller returns; they may be
 * temporaries of init. The ops and the partitions feature are derived from
 * the vtable: a plugin cannot declare an op it has no callback for. */
typedef struct engram_manifest {
    const char *name;          /* required, non-empty: the engine's name */
    const char *version;       /* free-form; NULL means "" */
    engram_model model;        /* required */
    uint32_t max_instances;    /* pooled only: cap of the pool, 0 = none */
    bool durable;              /* an acknowledged commit survives a crash */
    bool native_ttl;           /* the engine expires keys itself (advisory) */
    uint32_t max_commit_ops;   /* 0 = no cap; the host never sends more */
    uint32_t max_commit_bytes; /* encoded COMMIT size cap; 0 = none */
    uint32_t max_scan_batch;   /* pairs per batch cap; 0 = none */
} engram_manifest;

/* A scan's range and direction. start and end alias the request buffer:
 * valid only during scan_open; copy them into the scan's state. The SDK
 * answers empty ranges (end non-empty and start >= end) itself, so
 * scan_open always sees a range that may hold keys. */
typedef struct engram_scan_options {
    engram_bytes start; /* inclusive lower bound; empty = first key */
    engram_bytes end;   /* exclusive upper bound; empty = unbounded */
    bool reverse;       /* descending, from the last key < end */
    uint64_t limit;     /* pairs of the whole scan, 0 = none; the SDK
                           enforces it, so it is only a hint */
} engram_scan_options;

/*
 * The vtable. self is the pointer engram_plugin_entry returned alongside
 * the vtable, passed back verbatim. Every callback but scan_close returns
 * an engram_status; a non-OK status may carry a message (engram_fail).
 * Required: init, get, scan_open, scan_next, scan_close, commit, close.
 * Optional (NULL = absent): partitions, idle, size, reclaim.
 */
typedef struct engram_plugin {
    /* First call on every instance. Fill *manifest; config and the rest of
     * info as documented above. A non-OK status refuses the instance (at
     * load time, the plugin) with its message. */
    engram_status (*init)(void *self, engram_call *call,
                          const engram_init_info *info,
                          engram_manifest *manifest);

    /* Reply with the key's latest committed value via
     * `return engram_get_reply(call, value);`, or return ENGRAM_NOT_FOUND.
     * key is non-empty and aliases the request buffer. */
    engram_status (*get)(void *self, engram_call *call, engram_bytes key);

    /* Open a scan over a consistent snapshot of [start, end): commits that
     * returned before are visible, later ones are not, a commit is never
     * half visible, and this holds across every later batch. Store the
     * plugin's per-scan state in *scan (the SDK only passes it back). */
    engram_status (*scan_open)(void *self, engram_call *call,
                               const engram_scan_options *opts, void **scan);

    /* Emit the scan's next pairs in order with engram_scan_emit until it
     * returns false (the batch is full: that pair was NOT taken, offer it
     * first next time) or the scan has no more; then return ENGRAM_OK.
     * Returning OK having emitted nothing means the scan is exhausted. The
     * SDK may call scan_next again in the same request while the batch has
     * room, so a plugin may emit in chunks (e.g. one remote page a call). */
    engram_status (*scan_next)(void *self, engram_call *call, void *scan,
                               engram_batch *batch);

    /* Release a scan. Called exactly once per successful scan_open: when the
     * scan is exhausted, reaches its limit, fails, is closed by the host, or
     * at CLOSE. Never fails. */
    void (*scan_close)(void *self, void *scan);

    /* Apply ops[0..n) atomically or not at all; n >= 1, keys are non-empty
     * and distinct (the SDK checks before calling and answers INVALID
     * otherwise). ops and every slice in them alias the request buffer. On a
     * failed condition write nothing and
     * `return engram_commit_conflict(call, i, exists, current);` for the
     * lowest failing index. ENGRAM_UNCERTAIN means the outcome is unknown;
     * every other non-OK status means nothing was applied. */
    engram_status (*commit)(void *self, engram_call *call,
                            const engram_op *ops, size_t n);

    /* Release the engine: the last call. The SDK has closed every open scan
     * before; the host discards the instance whatever the answer. */
    engram_status (*close)(void *self, engram_call *call);

    /* Optional. Split [start, end) into contiguous ranges in key order with
     * engram_partitions_add: the first starts at start, the last ends at
     * end, each end is the next start; max_parts > 0 caps their number.
     * Present => the manifest declares PARTITIONS and the partitions
     * feature. */
    engram_status (*partitions)(void *self, engram_call *call,
                                engram_bytes start, engram_bytes end,
                                uint32_t max_parts);

    /* Optional. Sent now and then to an instance with no request in flight:
     * housekeeping (compaction, pinging connections). Answer quickly. NULL
     * answers OK. */
    engram_status (*idle)(void *self, engram_call *call);

    /* Optional (ABI 1.1). Store in *bytes how many bytes the engine's data
     * for this store takes: on disk for a durable engine, what it holds in
     * memory otherwise. It answers the host's DbSize, the
     * etcd_mvcc_db_total_size_in_bytes metric and the backend quota, so it
     * must be cheap enough to call often (keep a running count rather than
     * walk the data). *bytes starts at 0; a value above INT64_MAX makes the
     * SDK answer INTERNAL. Non-OK statuses: UNSUPPORTED, INVALID,
     * UNAVAILABLE (retryable), DEADLINE, INTERNAL. Present => the manifest
     * declares SIZE; absent, the host has no size for the store (the quota
     * cannot be enforced) and never sends SIZE. */
    engram_status (*size)(void *self, engram_call *call, uint64_t *bytes);

    /* Optional (ABI 1.1). Do the engine's space reclamation now (etcd's
     * Defragment): drop what deleted keys and superseded versions still
     * take, compact, give memory or disk back as far as the engine can.
     * Keep every live key readable and every committed write durable: it
     * changes where data sits, never what the store holds. It may take long
     * (the request's deadline applies; return ENGRAM_DEADLINE once it has
     * passed), but the host serialises a single instance's calls, so a
     * single-model plugin holds every commit while it runs: do bounded
     * work. Same statuses as size. Present => the manifest declares
     * RECLAIM; absent, the host answers Defragment with success and no
     * work. */
    engram_status (*reclaim)(void *self, engram_call *call);
} engram_plugin;

/* Defined by the plugin: returns its vtable (a static const, valid for the
 * module's lifetime) and stores its context in *self. The SDK calls it once
 * per instance, on the host's first call (after _initialize). Returning
 * NULL, or a vtable without a required callback, makes every request fail
 * with INTERNAL naming the problem. Only wasm builds reference it. */
const engram_plugin *engram_plugin_entry(void **self);

/* Defines engram_plugin_entry returning VTABLE and SELF. */
#define ENGRAM_PLUGIN(VTABLE, SELF)                                           \
    const engram_plugin *engram_plugin_entry(void **self) {                   \
        *self = (void *)(SELF);                                               \
        return (VTABLE);                                                      \
    }

/* The request's deadline in Unix nanoseconds (wall clock), 0 for none. The
 * host enforces it on every net_* call; use it to bound your own work. */
int64_t engram_call_deadline(const engram_call *call);

/* Sets the message of the non-OK status st and returns st, so that
 * `return engram_fail(call, ENGRAM_INVALID, "bad config: %s", why);` reads
 * naturally. The message is formatted into an SDK-owned buffer (truncated
 * at 1 KiB); without one the host sees "<OP>: <STATUS>". */
engram_status engram_fail(engram_call *call, engram_status st,
                          const char *fmt, ...) ENGRAM_PRINTF(3, 4);

/* get's sink: writes the OK response holding value, copied once into the
 * response buffer (value need only be valid during this call). Returns
 * ENGRAM_OK, or ENGRAM_INTERNAL with a message if the value cannot fit the
 * host's max_response or memory runs out. */
engram_status engram_get_reply(engram_call *call, engram_bytes value);

/* commit's conflict sink: writes the CONFLICT response for op index (the
 * lowest failing one), whether its key exists, and its current value
 * (ignored when !exists). Returns ENGRAM_CONFLICT, or ENGRAM_INTERNAL if
 * index is out of range or the value cannot fit. */
engram_status engram_commit_conflict(engram_call *call, size_t index,
                                     bool exists, engram_bytes current);

/* scan_next's sink: appends one pair to the batch, copied once into the
 * response. Returns true if it was taken; false if the batch is full (by
 * count, or because the pair does not fit in max_response), in which case
 * the pair was NOT taken and must be offered first in the next batch. A
 * pair too large for an empty batch fails the scan with INTERNAL. */
bool engram_scan_emit(engram_batch *batch, engram_bytes key,
                      engram_bytes value);

/* Pairs the batch still wants (by count; bytes may run out first). For a
 * plugin that fetches from a remote store, the page size to ask for. */
size_t engram_batch_want(const engram_batch *batch);

/* partitions' sink: appends the range [start, end) to the answer. Returns
 * false if memory runs out or the answer would exceed max_response (the
 * request then fails with INTERNAL whatever partitions returns). */
bool engram_partitions_add(engram_call *call, engram_bytes start,
                           engram_bytes end);

/* ------------------------------------------------------------------------
 * Host imports (module engram_host_v1), with thin wrappers. In a native
 * build (unit tests) they are stand-ins: logs go to stderr, the clock is
 * the process's, and every socket call answers ENGRAM_NET_DENIED or
 * ENGRAM_NET_CLOSED, as a host that granted nothing would.
 * ---------------------------------------------------------------------- */

/* Log levels (slog's). */
#define ENGRAM_LOG_DEBUG (-4)
#define ENGRAM_LOG_INFO 0
#define ENGRAM_LOG_WARN 4
#define ENGRAM_LOG_ERROR 8

/* Clock ids of engram_clock_now. */
#define ENGRAM_CLOCK_REALTIME 0  /* ns since the Unix epoch */
#define ENGRAM_CLOCK_MONOTONIC 1 /* ns from an arbitrary origin */

/* net_set_deadline selectors. */
#define ENGRAM_DEADLINE_BOTH 0
#define ENGRAM_DEADLINE_READ 1
#define ENGRAM_DEADLINE_WRITE 2

/* Negative results of the net_* functions. */
#define ENGRAM_NET_DENIED (-1)  /* capability not granted / address not allowed */
#define ENGRAM_NET_REFUSED (-2) /* peer refused or unreachable */
#define ENGRAM_NET_TIMEOUT (-3) /* a deadline passed (yours or the request's) */
#define ENGRAM_NET_EOF (-4)     /* the peer closed the connection */
#define ENGRAM_NET_CLOSED (-5)  /* unknown or closed handle */
#define ENGRAM_NET_INVALID (-6) /* pointer outside memory, bad selector */
#define ENGRAM_NET_LIMIT (-7)   /* too many open connections */
#define ENGRAM_NET_IO (-8)      /* any other I/O error (the host logs it) */

/* Writes msg[0..len) (UTF-8; not kept) to the host's log at level. */
void engram_log(int32_t level, const char *msg, size_t len);
/* printf-style engram_log through a 1 KiB stack buffer (truncates). */
void engram_logf(int32_t level, const char *fmt, ...) ENGRAM_PRINTF(2, 3);
/* Nanoseconds of clock (ENGRAM_CLOCK_*), or -1 for an unknown clock. */
int64_t engram_clock_now(int32_t clock);
/* Opens a TCP connection to addr[0..len) ("host:port", matched exactly
 * against the operator's list; no DNS). timeout_ms <= 0 means the
 * request's deadline. Returns a handle >= 0 or ENGRAM_NET_*. Connections
 * belong to the instance and survive across requests. */
int32_t engram_net_dial(const char *addr, size_t len, int32_t timeout_ms);
/* Reads up to len bytes into buf; blocks until at least one byte. Returns
 * the count (> 0; 0 only when len is 0) or ENGRAM_NET_* (EOF at end). */
int32_t engram_net_read(int32_t handle, void *buf, size_t len);
/* Writes up to len bytes; returns the count written (> 0, maybe < len) or
 * ENGRAM_NET_*. */
int32_t engram_net_write(int32_t handle, const void *buf, size_t len);
/* Writes all len bytes, looping over short writes: 0 or ENGRAM_NET_*. */
int32_t engram_net_write_all(int32_t handle, const void *buf, size_t len);
/* Closes the connection: 0 or ENGRAM_NET_CLOSED. */
int32_t engram_net_close(int32_t handle);
/* Sets the plugin's own deadline (Unix ns; 0 clears) for reads, writes or
 * both (ENGRAM_DEADLINE_*); the request's deadline applies too, the
 * earlier wins. 0 or ENGRAM_NET_*. */
int32_t engram_net_set_deadline(int32_t handle, int32_t which,
                                int64_t unix_ns);
/* "DENIED", "TIMEOUT", ... for a net_* result; "OK" if >= 0. Static. */
const char *engram_net_strerror(int32_t code);

/* ------------------------------------------------------------------------
 * The instance: the dispatcher behind the exports. A wasm plugin never
 * touches it (the SDK's exports drive a single static one); it is public so
 * that a plugin's native tests can drive their vtable with real requests.
 * ---------------------------------------------------------------------- */

typedef struct engram_instance engram_instance;

/* Creates an instance serving vtable with context self (malloc once), or
 * NULL when out of memory. An invalid vtable still yields an instance; it
 * answers every request with INTERNAL naming what is missing. */
engram_instance *engram_instance_new(const engram_plugin *vtable, void *self);
/* Frees the instance and its buffers. It does not call close or
 * scan_close: send CLOSE first for an orderly end. */
void engram_instance_free(engram_instance *inst);
/* kvp_buffer: the request buffer with room for min_cap bytes, or NULL when
 * out of memory. Valid until the next call of this function; growing
 * discards its contents. */
uint8_t *engram_instance_buffer(engram_instance *inst, size_t min_cap);
/* kvp_dispatch: handles the req_len-byte request at the start of the
 * buffer. The response is SDK-owned and valid until the next call on inst;
 * it is never empty and never longer than the INIT's max_response. */
engram_bytes engram_instance_dispatch(engram_instance *inst, uint32_t op,
                                      size_t req_len);

/* ------------------------------------------------------------------------
 * The codec (ABI.md section 4). Decoders alias their input (never copy,
 * never allocate) and are strict: a varint longer than 10 bytes, over 64
 * bits, not in its shortest form, or over its field's range; a truncated
 * field; a count the remaining bytes cannot hold; a bad bool, kind or
 * reserved flag; trailing bytes after a fixed-layout message: all are
 * rejected. INIT's request and the manifest are extensible: trailing bytes
 * are ignored. Decoders never read outside [b, b+n) whatever the input.
 * Encoders append to an engram_buf and emit the shortest form.
 * ---------------------------------------------------------------------- */

typedef enum engram_err {
    ENGRAM_E_OK = 0,
    ENGRAM_E_SHORT,        /* the message ends inside a field */
    ENGRAM_E_OVERFLOW,     /* varint > 10 bytes / 64 bits, or over its field */
    ENGRAM_E_NOT_SHORTEST, /* varint not in its shortest form */
    ENGRAM_E_TRAILING,     /* bytes after a fixed-layout message */
    ENGRAM_E_BAD_VALUE,    /* bad bool, op kind, reserved flag, status */
    ENGRAM_E_COUNT,        /* a count the remaining bytes cannot hold */
    ENGRAM_E_ROOM,         /* the caller's array is too small (see below) */
} engram_err;

/* A static name for e. */
const char *engram_err_str(engram_err e);
/* "OK", "NOT_FOUND", ...; "?" outside the ABI. Static. */
const char *engram_status_name(int status);
/* "INIT", "GET", ...; "?" for an unknown code. Static. */
const char *engram_op_name(int op);
/* Whether a response to op may carry status st (ABI.md 4.2). */
bool engram_status_allowed(int op, int st);

/* A growable output buffer. Zero-initialise it; engram_buf_free releases
 * it. Growth is geometric, so appending is amortised O(1) and a reused
 * buffer stops allocating once it has reached its high-water mark. */
typedef struct engram_buf {
    uint8_t *ptr;
    size_t len;
    size_t cap;
} engram_buf;

/* Ensures room for n more bytes; false when out of memory (buf intact). */
bool engram_buf_reserve(engram_buf *buf, size_t n);
void engram_buf_free(engram_buf *buf);

/* Varint and byte-string primitives. */
size_t engram_uvarint_len(uint64_t v);
/* Writes v at dst (room for 10 bytes) and returns the bytes written. */
size_t engram_put_uvarint(uint8_t *dst, uint64_t v);
/* Decodes a strict varint from b[0..n) into *v and its size into *used. */
engram_err engram_get_uvarint(const uint8_t *b, size_t n, uint64_t *v,
                              size_t *used);
bool engram_buf_put_uvarint(engram_buf *buf, uint64_t v);
bool engram_buf_put_bytes(engram_buf *buf, engram_bytes p);

/* Requests. Every one starts with the deadline (unix ns, 0 = none). Byte
 * strings of a decoded request alias the input. */
typedef struct engram_init_req {
    int64_t deadline;
    engram_bytes config;
    uint64_t host_flags;
    uint32_t instance;
    uint32_t max_response;
} engram_init_req;

typedef struct engram_get_req {
    int64_t deadline;
    engram_bytes key;
} engram_get_req;

typedef struct engram_scan_open_req {
    int64_t deadline;
    engram_bytes start;
    engram_bytes end;
    bool reverse;
    uint64_t limit;
    uint32_t batch_size;
} engram_scan_open_req;

typedef struct engram_scan_next_req {
    int64_t deadline;
    uint64_t id;
    uint32_t batch_size;
} engram_scan_next_req;

typedef struct engram_scan_close_req {
    int64_t deadline;
    uint64_t id;
} engram_scan_close_req;

/* ops is the caller's array: decoding fills ops[0..count). */
typedef struct engram_commit_req {
    int64_t deadline;
    engram_op *ops;
    size_t count;
} engram_commit_req;

typedef struct engram_partitions_req {
    int64_t deadline;
    engram_bytes start;
    engram_bytes end;
    uint32_t max_parts;
} engram_partitions_req;

/* CLOSE, IDLE, SIZE and RECLAIM: the header alone. */
typedef struct engram_empty_req {
    int64_t deadline;
} engram_empty_req;

engram_err engram_decode_header(const uint8_t *b, size_t n, int64_t *deadline);
engram_err engram_decode_init_req(const uint8_t *b, size_t n, engram_init_req *m);
engram_err engram_decode_get_req(const uint8_t *b, size_t n, engram_get_req *m);
engram_err engram_decode_scan_open_req(const uint8_t *b, size_t n, engram_scan_open_req *m);
engram_err engram_decode_scan_next_req(const uint8_t *b, size_t n, engram_scan_next_req *m);
engram_err engram_decode_scan_close_req(const uint8_t *b, size_t n, engram_scan_close_req *m);
/* m->ops must have room for cap ops. If the request holds more, returns
 * ENGRAM_E_ROOM with m->count set to the number needed (at most n/2): grow
 * and decode again. */
engram_err engram_decode_commit_req(const uint8_t *b, size_t n, engram_commit_req *m, size_t cap);
engram_err engram_decode_partitions_req(const uint8_t *b, size_t n, engram_partitions_req *m);
engram_err engram_decode_empty_req(const uint8_t *b, size_t n, engram_empty_req *m);

/* Encoders append the request body; false when out of memory. */
bool engram_encode_init_req(engram_buf *buf, const engram_init_req *m);
bool engram_encode_get_req(engram_buf *buf, const engram_get_req *m);
bool engram_encode_scan_open_req(engram_buf *buf, const engram_scan_open_req *m);
bool engram_encode_scan_next_req(engram_buf *buf, const engram_scan_next_req *m);
bool engram_encode_scan_close_req(engram_buf *buf, const engram_scan_close_req *m);
bool engram_encode_commit_req(engram_buf *buf, const engram_commit_req *m);
bool engram_encode_partitions_req(engram_buf *buf, const engram_partitions_req *m);
bool engram_encode_empty_req(engram_buf *buf, const engram_empty_req *m);

/* Responses: a status byte and a body. */
typedef struct engram_wire_manifest {
    engram_bytes name;
    engram_bytes version;
    uint32_t abi_minor;
    uint8_t model; /* checked by the host, not the codec */
    uint32_t max_instances;
    uint64_t ops;
    uint64_t features;
    uint32_t max_commit_ops;
    uint32_t max_commit_bytes;
    uint32_t max_scan_batch;
} engram_wire_manifest;

typedef struct engram_pair {
    engram_bytes key;
    engram_bytes value;
} engram_pair;

typedef struct engram_range {
    engram_bytes start;
    engram_bytes end;
} engram_range;

typedef struct engram_conflict {
    uint32_t index;
    bool exists;
    engram_bytes current;
} engram_conflict;

/* Splits a response into its status and body; an empty response or a
 * status above ENGRAM_INTERNAL is an error. */
engram_err engram_split_response(const uint8_t *b, size_t n, int *status,
                                 const uint8_t **body, size_t *body_len);

/* Body decoders (after engram_split_response). Arrays are the caller's:
 * with cap too small they return ENGRAM_E_ROOM and the count needed. */
engram_err engram_decode_manifest(const uint8_t *b, size_t n, engram_wire_manifest *m);
engram_err engram_decode_value(const uint8_t *b, size_t n, engram_bytes *value);
engram_err engram_decode_message(const uint8_t *b, size_t n, engram_bytes *msg);
engram_err engram_decode_conflict(const uint8_t *b, size_t n, engram_conflict *c);
engram_err engram_decode_scan_opened(const uint8_t *b, size_t n, uint64_t *id,
                                     engram_pair *pairs, size_t cap,
                                     size_t *count, bool *more);
engram_err engram_decode_batch(const uint8_t *b, size_t n, engram_pair *pairs,
                               size_t cap, size_t *count, bool *more);
engram_err engram_decode_partitions(const uint8_t *b, size_t n,
                                    engram_range *ranges, size_t cap,
                                    size_t *count);
/* An empty OK body (SCAN_CLOSE, COMMIT, CLOSE, IDLE, RECLAIM) or a
 * NOT_FOUND body, which must be empty. */
engram_err engram_decode_empty(const uint8_t *b, size_t n);

/* Whole-response encoders (status byte included); false when out of
 * memory. */
bool engram_encode_status(engram_buf *buf, engram_status st); /* empty body */
bool engram_encode_error(engram_buf *buf, engram_status st, engram_bytes msg);
bool engram_encode_manifest(engram_buf *buf, const engram_wire_manifest *m);
bool engram_encode_value(engram_buf *buf, engram_bytes value);
bool engram_encode_conflict(engram_buf *buf, const engram_conflict *c);
bool engram_encode_scan_opened(engram_buf *buf, uint64_t id,
                               const engram_pair *pairs, size_t count,
                               bool more);
bool engram_encode_batch(engram_buf *buf, const engram_pair *pairs,
                         size_t count, bool more);
bool engram_encode_partitions(engram_buf *buf, const engram_range *ranges,
                              size_t count);
/* SIZE's OK body: the byte count, an i64 (negative or over 63 bits is
 * ENGRAM_E_OVERFLOW). The encoder writes the whole OK response; bytes must
 * be >= 0. */
engram_err engram_decode_size(const uint8_t *b, size_t n, int64_t *bytes);
bool engram_encode_size(engram_buf *buf, int64_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* ENGRAM_PLUGIN_H */
