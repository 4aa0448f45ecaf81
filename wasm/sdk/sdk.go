// Package sdk turns a Go type into an Engram storage plugin: a WebAssembly
// module that Engram loads at run time instead of a compiled-in engine.
//
// A plugin implements Store and registers it from main:
//
//	package main
//
//	import "github.com/engramkv/engram/wasm/sdk"
//
//	func main() { sdk.Serve(&myStore{}) }
//
// and is built as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o my.wasm .
//
// Check it with `engram plugin verify my.wasm --config '...'`, which runs
// Engram's adaptor conformance suite against it.
//
// Optional interfaces on the Store declare optional ops in the manifest:
// Partitioner (PARTITIONS), Idler (IDLE), and since ABI 1.1 Sizer (SIZE:
// etcd's DbSize and the backend quota) and Reclaimer (RECLAIM: etcd's
// Defragment).
//
// This package owns the plugin side of the ABI (../abi/ABI.md): the exports
// kvp_abi_version, kvp_buffer and kvp_dispatch, decoding requests, encoding
// responses, mapping errors to statuses, and Go-friendly wrappers of the host
// imports (Dial for sockets, Logger for logs). It depends on nothing but the
// abi module and the standard library, and must stay that way: whatever it
// imports lands in every plugin binary.
//
// # What a plugin author must know
//
// One instance is one thread. The host calls an instance for one request at
// a time, and the Go runtime inside only runs while a call is in progress.
// Between calls nothing runs: goroutines, timers and tickers a driver starts
// (keep-alives, pool reapers, context watchers) are frozen until the next
// call, and during a call they run only when it blocks, at the end of every
// few dozen calls (when the SDK yields, so that the garbage collector's
// background work can finish) and at IDLE. Do all work inside the Store
// methods; do not start background goroutines that must make progress on
// their own.
//
// Deadlines come from the host. Every request carries the caller's deadline
// (the ctx passed to each method has it), and the host applies it to every
// socket operation: a read blocked past the deadline returns a timeout error,
// which drivers report as a failed query. A Go context timeout set inside the
// plugin cannot interrupt a blocked host read (no other goroutine runs to
// cancel it), so rely on the host's. A call that runs far past its deadline,
// or traps (a panic, a fatal error, running out of memory), ends with the
// instance being thrown away and replaced by a fresh one: never rely on
// state surviving an error.
//
// Networking is TCP only, to addresses the operator allowed
// (storage.wasm.allowed-addresses, exact host:port strings). There is no DNS
// inside the plugin: pass IP addresses, or host names exactly as the
// operator listed them. Dial returns a net.Conn that real drivers (pgx,
// go-redis, go-sql-driver/mysql) accept through their dialer hooks. There is
// no file system, no environment, and no TLS roots unless you embed them.
//
// Memory is limited by the operator (storage.wasm.memory-limit); exceeding
// it traps the instance. Linear memory never shrinks: a Go plugin's heap
// high-water mark is what it costs. Keep batches bounded (Manifest limits)
// and do not cache unboundedly.
//
// The instance model, declared in the Manifest, decides how many instances
// the host runs. ModelSingle: the plugin keeps its data in its own memory,
// the host runs exactly one instance and every call is serialised through
// it; if that instance crashes its data is gone, so the host stops serving
// rather than continue on an empty store. ModelPooled: the plugin is a
// stateless client of a remote store; the host runs several instances
// (storage.wasm.pool-size), replaces crashed ones, and every instance gets
// the same Init. A scan is always continued on the instance that opened it.
//
// Byte slices passed to Store methods (keys, values, Op fields, the Init
// config) alias the request buffer and are valid only until the method
// returns: copy what you keep. Slices you return are copied into the response
// before the next call, so you may reuse their memory afterwards.
package sdk

import (
	"context"
	"errors"
	"fmt"

	"github.com/engramkv/engram/wasm/abi"
)

// Store is what a plugin implements. Its methods mirror Engram's kv.Store
// (see the contract in core/kv of the Engram repository); the SDK calls them
// one at a time per instance, never concurrently.
type Store interface {
	// Init configures a fresh instance with the operator's config
	// (storage.wasm.config, verbatim) and describes the plugin. It is the
	// first call on every instance; an error refuses the instance and, at
	// load time, the plugin.
	Init(ctx context.Context, config []byte, host HostInfo) (Manifest, error)
	// Get returns key's value, or an error wrapping ErrNotFound.
	Get(ctx context.Context, key []byte) ([]byte, error)
	// Scan opens an iterator over a consistent snapshot of
	// [opts.Start, opts.End): batches committed before Scan are visible,
	// later ones are not, and a batch is never half visible.
	Scan(ctx context.Context, opts ScanOptions) (Iterator, error)
	// Commit applies ops atomically. When a condition fails, nothing is
	// written and the error is a *ConflictError for the lowest failing
	// index. When the outcome is unknown (a timeout after the commit was
	// sent), wrap ErrUncertain. Any other error means nothing was applied.
	// ops never name the same key twice and keys are non-empty (the SDK
	// checks before calling).
	Commit(ctx context.Context, ops []Op) error
	// Close releases the engine; the instance is discarded afterwards.
	Close(ctx context.Context) error
}

// Iterator yields one scan's pairs in batches.
type Iterator interface {
	// Next returns up to max pairs (max > 0 always), in the scan's order,
	// continuing where the previous batch ended. An empty batch with a nil
	// error means the scan is exhausted.
	Next(ctx context.Context, max int) ([]Pair, error)
	// Close releases the snapshot.
	Close() error
}

// Partitioner is optionally implemented by a Store whose engine can split a
// range into parts of similar size (the Partitions feature).
type Partitioner interface {
	// Partitions splits [start, end) into contiguous ranges in key order;
	// the first starts at start and the last ends at end. max > 0 caps
	// their number when the host asks for a cap.
	Partitions(ctx context.Context, start, end []byte, max int) ([]Range, error)
}

// Idler is optionally implemented by a Store that wants to do housekeeping
// while the instance is idle (ping connections, drop expired state). The
// host calls it now and then on instances with no request in flight; the SDK
// also lets the Go runtime run its garbage collector then.
type Idler interface {
	Idle(ctx context.Context) error
}

// Sizer is optionally implemented by a Store that can tell how many bytes
// its data takes: on disk for a durable engine, the table(s) it owns for a
// client of a database, the bytes held for an in-memory one. Implementing
// it declares ABI 1.1's SIZE, and Engram then reports the size as etcd's
// DbSize and its db size metric, and enforces quota-backend-bytes with it.
// Keep it cheap (it is asked for about once a second under writes when a
// quota is set); a figure from the engine's statistics that lags recent
// writes is acceptable, a negative one is sent as 0.
type Sizer interface {
	Size(ctx context.Context) (int64, error)
}

// Reclaimer is optionally implemented by a Store whose engine can give back
// the space deleted data still takes, on request (a compaction, a VACUUM).
// Implementing it declares ABI 1.1's RECLAIM, which Engram sends for etcd's
// Defragment. Reclaim must keep every live key readable and every committed
// write durable, must not hold commits (on other instances) for its whole
// run, and may take long: ctx carries the caller's deadline.
type Reclaimer interface {
	Reclaim(ctx context.Context) error
}

// RawDispatcher is optionally implemented by a Store that handles requests
// in their encoded form (a proxy to a server that speaks the ABI's encoding,
// or a test plugin that must misbehave at the byte level). After INIT, the
// SDK offers every request but CLOSE to Dispatch first; if handled is true,
// resp is returned to the host verbatim and must stay unchanged until the
// next call. Most plugins do not need it.
type RawDispatcher interface {
	Dispatch(op abi.Op, req []byte) (resp []byte, handled bool)
}

// HostInfo tells Init about the host.
type HostInfo struct {
	// Instance is this instance's index in the host's pool (0 for
	// ModelSingle). A replacement instance reuses the index.
	Instance int
	// NetAllowed is true when the operator allowed at least one address,
	// so Dial may succeed.
	NetAllowed bool
	// MaxResponse is the largest response the host accepts, in bytes; the
	// SDK splits scan batches to stay below it.
	MaxResponse int
}

// Model is the instance model: see the package documentation.
type Model = abi.Model

// The instance models.
const (
	ModelSingle = abi.ModelSingle
	ModelPooled = abi.ModelPooled
)

// Manifest describes a plugin to the host.
type Manifest struct {
	// Name identifies the engine in logs, metrics and Status; required.
	Name string
	// Version is the plugin's version, free-form.
	Version string
	// Model is ModelSingle or ModelPooled; required.
	Model Model
	// MaxInstances caps the host's pool (0: no cap). Ignored for
	// ModelSingle, which is always one instance.
	MaxInstances int
	// Durable: an acknowledged Commit survives a crash of Engram and of
	// the plugin (never true for data kept in the plugin's memory).
	Durable bool
	// NativeTTL: the engine can expire keys by itself (advisory).
	NativeTTL bool
	// MaxCommitOps, MaxCommitBytes and MaxScanBatch bound one Commit's
	// ops, one Commit's encoded size, and one scan batch's pairs; 0 means
	// no bound. The host refuses bigger commits with a clear error rather
	// than sending them.
	MaxCommitOps   int
	MaxCommitBytes int
	MaxScanBatch   int
}

// ScanOptions selects a scan's range and direction.
type ScanOptions struct {
	// Start is the inclusive lower bound; empty means the first key.
	Start []byte
	// End is the exclusive upper bound; empty means no upper bound.
	End []byte
	// Reverse yields keys in descending order, from the last key < End.
	Reverse bool
	// Limit caps the pairs of the whole scan; 0 means no limit. The SDK
	// enforces it too, so an iterator may ignore it.
	Limit int
}

// Pair is one key and value.
type Pair = abi.Pair

// Range is a half-open key range [Start, End); an empty End is unbounded.
type Range = abi.Range

// Op is one write of a Commit batch.
type Op = abi.CommitOp

// OpKind is the kind of an Op.
type OpKind = abi.OpKind

// The kinds of writes, with kv.OpKind's meaning.
const (
	// OpPut writes Value unconditionally.
	OpPut = abi.KindPut
	// OpDelete removes Key; deleting an absent key is not an error.
	OpDelete = abi.KindDelete
	// OpPutIfAbsent writes Value only if Key is absent.
	OpPutIfAbsent = abi.KindPutIfAbsent
	// OpCompareAndSwap writes Value only if Key holds Expected.
	OpCompareAndSwap = abi.KindCompareAndSwap
	// OpCompareAndDelete removes Key only if it holds Expected.
	OpCompareAndDelete = abi.KindCompareAndDelete
)

// Errors a Store returns (wrapped with detail, via fmt.Errorf("...: %w",
// ErrX)) to select the response status. Any other error is INTERNAL; a
// context.DeadlineExceeded or context.Canceled anywhere in the chain, or a
// net.Error timeout from a Dial connection, is DEADLINE.
var (
	// ErrNotFound: Get of an absent key (NOT_FOUND).
	ErrNotFound = errors.New("not found")
	// ErrUncertain: a Commit whose outcome is unknown (UNCERTAIN).
	ErrUncertain = errors.New("commit outcome uncertain")
	// ErrUnsupported: an operation the plugin does not implement
	// (UNSUPPORTED).
	ErrUnsupported = errors.New("unsupported")
	// ErrInvalid: a request the plugin refuses as malformed or too large
	// (INVALID); the batch was not applied.
	ErrInvalid = errors.New("invalid request")
	// ErrUnavailable: the engine cannot be reached right now
	// (UNAVAILABLE); nothing was applied and a retry may succeed.
	ErrUnavailable = errors.New("unavailable")
	// ErrDeadline: the request's deadline passed before the work was done
	// (DEADLINE); nothing was applied. For a Commit that may have been
	// sent, return ErrUncertain instead.
	ErrDeadline = errors.New("deadline exceeded")
)

// ConflictError reports the first conditional op of a batch whose condition
// did not hold; nothing of the batch was written.
type ConflictError struct {
	// Index is the failing op's position in the batch.
	Index int
	// Exists reports whether the key was present at commit time.
	Exists bool
	// Current is the key's value at commit time when Exists.
	Current []byte
}

func (e *ConflictError) Error() string {
	if !e.Exists {
		return fmt.Sprintf("conflict on op %d: key is absent", e.Index)
	}
	return fmt.Sprintf("conflict on op %d: key holds a different value", e.Index)
}

// Serve registers s as this plugin's store. Call it exactly once, from main
// (or from an init function); it returns at once. In a wasip1 reactor the Go
// runtime does not run main by itself: the SDK runs it on the first call from
// the host, before the handshake.
func Serve(s Store) {
	if s == nil {
		panic("sdk.Serve: nil Store")
	}
	if registered != nil {
		panic("sdk.Serve called twice")
	}
	registered = s
}

// registered is the store passed to Serve. It is package state because a
// wasm module's exports are package-level functions: there is exactly one
// plugin per module.
var registered Store
