// Package kv defines the storage adaptor contract: the small, ordered key-value
// interface that every engine Engram runs on (badger, TiKV, a .wasm plugin, ...)
// implements, and nothing more.
//
// The core owns everything that makes Engram an etcd: revisions, MVCC, watches,
// leases, compaction. An adaptor only stores opaque byte keys and values in
// byte-wise (bytes.Compare) order and offers four primitives:
//
//   - Get: a point read of the latest committed value.
//   - Scan: iteration over a consistent snapshot of [Start, End), forward or
//     reverse, with an optional limit, delivered in batches.
//   - Commit: an atomic batch of conditional and unconditional writes.
//   - Partitions (optional): split points so the core can scan a large range
//     in parallel.
//
// Optional interfaces add what only some engines can do: Sizer, Reclaimer,
// BulkLoader (filling an empty store from sorted pairs, for restores).
//
// This package must not import any engine, gRPC or Kubernetes code: it is the
// boundary that plugin SDKs and the wasm ABI mirror, so it stays small and
// batch-shaped (no per-key callbacks cross it).
//
// # Contract
//
// Keys are non-empty byte strings of at most MaxKeySize bytes; values are byte
// strings (possibly empty) of at most MaxValueSize bytes. A nil value and an
// empty value are the same value. Adaptors must accept every byte in keys and
// values, including 0x00 and 0xFF.
//
// Get returns ErrNotFound for an absent key. It observes every batch whose
// Commit returned nil before Get was called (read-your-writes, linearizable
// with respect to Commit).
//
// Scan opens an iterator over a snapshot taken when Scan is called: batches
// committed after Scan returns are never visible to it, batches committed
// before are always visible, and a batch is never half visible. Forward scans
// yield keys in ascending order starting at the first key >= Start; reverse
// scans yield keys in descending order starting at the last key < End. A nil
// or empty End means "to the end of the keyspace"; Start == nil means from the
// first key. Limit > 0 caps the total number of pairs the iterator yields.
// Next returns the next non-empty batch; an empty batch with a nil error means
// the iterator is exhausted. The slices in a batch are owned by the caller and
// stay valid after further calls (adaptors copy out of engine buffers).
//
// Commit applies all operations of a batch atomically or none of them. A batch
// never names the same key twice. Conditional operations (PutIfAbsent,
// CompareAndSwap, CompareAndDelete) are checked against the state at commit
// time; if any check fails nothing is written and Commit returns a
// *ConflictError naming the first failing operation (lowest index) and the
// key's current value. If the engine cannot tell whether the batch was applied
// (a timeout after the commit was sent, an undetermined distributed commit),
// Commit returns an error wrapping ErrUncertain; the core then resolves the
// outcome by reading back. Any other error means the batch was not applied.
// Once Commit returns nil the batch is durable to the engine's promise (for
// the embedded engines: on disk, fsynced). Concurrent Commit calls are allowed
// and must behave as if executed in some serial order; engines are encouraged
// to share one fsync between concurrent commits (group commit).
//
// All methods are safe for concurrent use. After Close, calls return
// ErrClosed.
//
// It is public: it is the one package an adaptor author must import
// (natively; a .wasm adaptor sees the same contract through the sdk module).
package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
)

// Size limits every adaptor must accept. The core never sends more.
const (
	// MaxKeySize bounds an internal key (an etcd key plus Engram's framing).
	// It stays below badger's 65000-byte key limit with room for an
	// adaptor's own prefix.
	MaxKeySize = 60000
	// MaxValueSize bounds one value (an etcd value plus Engram's record header).
	MaxValueSize = 4 << 20
)

var (
	// ErrNotFound is returned by Get for an absent key.
	ErrNotFound = errors.New("kv: key not found")
	// ErrUncertain marks a Commit whose outcome is unknown: it may or may not
	// have been applied. Adaptors wrap it with the engine's cause.
	ErrUncertain = errors.New("kv: commit result uncertain")
	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("kv: store closed")
	// ErrBatchTooLarge is returned by Commit for a batch larger than the
	// engine can apply atomically. Nothing was written. Adaptors wrap it
	// with the engine's limit.
	ErrBatchTooLarge = errors.New("kv: batch too large for one atomic commit")
	// ErrUnsupported is returned for an optional capability the adaptor does
	// not declare in its Features.
	ErrUnsupported = errors.New("kv: operation not supported by this adaptor")
)

// Store is a storage adaptor. See the package documentation for the contract.
type Store interface {
	// Features declares what the adaptor supports beyond the required core.
	Features() Features
	// Get returns the value of key, or ErrNotFound.
	Get(ctx context.Context, key []byte) ([]byte, error)
	// Scan opens a snapshot iterator over [opts.Start, opts.End).
	Scan(ctx context.Context, opts ScanOptions) (Iterator, error)
	// Commit applies ops atomically; see the contract for its errors.
	Commit(ctx context.Context, ops []Op) error
	// Partitions splits [start, end) into contiguous ranges that can be
	// scanned independently, in key order. Adaptors without the Partitions
	// feature return the whole range as one partition.
	Partitions(ctx context.Context, start, end []byte) ([]Range, error)
	// Close releases the engine. It waits for in-flight commits.
	Close() error
}

// Iterator yields the pairs of one Scan in batches.
type Iterator interface {
	// Next returns the next batch of pairs. An empty batch with a nil error
	// means the scan is complete.
	Next(ctx context.Context) ([]Pair, error)
	// Close releases the snapshot. It is safe to call more than once.
	Close() error
}

// ScanOptions selects the range and direction of a Scan.
type ScanOptions struct {
	// Start is the inclusive lower bound; nil means the first key.
	Start []byte
	// End is the exclusive upper bound; nil or empty means no upper bound.
	End []byte
	// Reverse yields keys in descending order, from the last key < End.
	Reverse bool
	// Limit caps the number of pairs yielded in total; 0 means no limit.
	Limit int
	// BatchSize is a hint for the number of pairs per Next; 0 lets the
	// adaptor choose.
	BatchSize int
	// ValuePrefix > 0 says the caller reads only the first ValuePrefix
	// bytes of each value (the core counting keys by their record
	// headers): an adaptor may return just that prefix and save copying
	// the rest. It is a hint; whole values are always correct.
	ValuePrefix int
}

// Pair is one key and its value.
type Pair struct {
	Key   []byte
	Value []byte
}

// Range is a half-open key range [Start, End); an empty End means unbounded.
type Range struct {
	Start []byte
	End   []byte
}

// OpKind is the kind of one write in a batch.
type OpKind uint8

// The write operations a batch may contain.
const (
	// OpPut writes Value unconditionally.
	OpPut OpKind = iota + 1
	// OpDelete removes Key unconditionally; deleting an absent key is not an
	// error.
	OpDelete
	// OpPutIfAbsent writes Value only if Key is absent.
	OpPutIfAbsent
	// OpCompareAndSwap writes Value only if Key is present with value
	// Expected.
	OpCompareAndSwap
	// OpCompareAndDelete removes Key only if it is present with value
	// Expected.
	OpCompareAndDelete
)

func (k OpKind) String() string {
	switch k {
	case OpPut:
		return "Put"
	case OpDelete:
		return "Delete"
	case OpPutIfAbsent:
		return "PutIfAbsent"
	case OpCompareAndSwap:
		return "CompareAndSwap"
	case OpCompareAndDelete:
		return "CompareAndDelete"
	default:
		return fmt.Sprintf("OpKind(%d)", uint8(k))
	}
}

// Conditional reports whether the op carries a precondition.
func (k OpKind) Conditional() bool {
	return k == OpPutIfAbsent || k == OpCompareAndSwap || k == OpCompareAndDelete
}

// Op is one write of a batch.
type Op struct {
	Kind OpKind
	Key  []byte
	// Value is the new value for OpPut, OpPutIfAbsent and OpCompareAndSwap.
	Value []byte
	// Expected is the value that must be present for OpCompareAndSwap and
	// OpCompareAndDelete.
	Expected []byte
}

// Holds reports whether op's condition is true of a key that exists with
// value current (exists false: absent). Ops without a condition always hold.
// Every adaptor judges conditions by this one rule.
func (op Op) Holds(current []byte, exists bool) bool {
	switch op.Kind {
	case OpPutIfAbsent:
		return !exists
	case OpCompareAndSwap, OpCompareAndDelete:
		return exists && bytes.Equal(current, op.Expected)
	}
	return true
}

// Conflict returns the ConflictError for op, the index-th op of its batch,
// failing against current (exists false: absent). It copies the key and the
// value, so callers may pass engine buffers.
func (op Op) Conflict(index int, current []byte, exists bool) *ConflictError {
	c := &ConflictError{Index: index, Key: bytes.Clone(op.Key), Exists: exists}
	if exists {
		c.Current = bytes.Clone(current)
		if c.Current == nil {
			c.Current = []byte{}
		}
	}
	return c
}

// Put returns an unconditional write.
func Put(key, value []byte) Op { return Op{Kind: OpPut, Key: key, Value: value} }

// Delete returns an unconditional delete.
func Delete(key []byte) Op { return Op{Kind: OpDelete, Key: key} }

// PutIfAbsent returns a write that succeeds only if key is absent.
func PutIfAbsent(key, value []byte) Op { return Op{Kind: OpPutIfAbsent, Key: key, Value: value} }

// CompareAndSwap returns a write that succeeds only if key holds expected.
func CompareAndSwap(key, expected, value []byte) Op {
	return Op{Kind: OpCompareAndSwap, Key: key, Expected: expected, Value: value}
}

// CompareAndDelete returns a delete that succeeds only if key holds expected.
func CompareAndDelete(key, expected []byte) Op {
	return Op{Kind: OpCompareAndDelete, Key: key, Expected: expected}
}

// ConflictError reports the first conditional op of a batch whose condition
// did not hold. Nothing of the batch was written.
type ConflictError struct {
	// Index is the position of the failing op in the batch.
	Index int
	// Key is the failing op's key.
	Key []byte
	// Exists reports whether the key was present at commit time.
	Exists bool
	// Current is the key's value at commit time when Exists is true.
	Current []byte
}

func (e *ConflictError) Error() string {
	if !e.Exists {
		return fmt.Sprintf("kv: conflict on op %d (key %q): key is absent", e.Index, e.Key)
	}
	return fmt.Sprintf("kv: conflict on op %d (key %q): key holds a different value", e.Index, e.Key)
}

// AsConflict returns the *ConflictError in err's chain, if any.
func AsConflict(err error) (*ConflictError, bool) {
	var c *ConflictError
	ok := errors.As(err, &c)
	return c, ok
}

// Features declares an adaptor's optional capabilities.
type Features struct {
	// Name identifies the engine in logs, metrics and Status responses.
	Name string
	// Partitions is true when Partitions returns more than one range for
	// large ranges, so parallel scans pay off.
	Partitions bool
	// NativeTTL is true when the engine can expire keys by itself. The core
	// does not rely on it for etcd leases; it is advisory.
	NativeTTL bool
	// Durable is true when an acknowledged Commit survives a process crash.
	Durable bool
}

// Sizer is implemented by adaptors that can report how many bytes their data
// takes (on disk for durable engines). It is optional: Status reports it as
// etcd's DbSize, which kube-apiserver exports as its storage size metric,
// and quota-backend-bytes is enforced against it. A figure that lags writes
// (an engine's statistics) is acceptable; a negative one is not. A wasm
// plugin's store implements it only when the plugin declares the ABI's SIZE.
type Sizer interface {
	Size() (int64, error)
}

// ValidateBatch checks the structural rules of a batch that every adaptor
// relies on: known kinds, non-empty keys within limits, no key named twice.
// Adaptors call it at the start of Commit so a bad batch is refused the same
// way everywhere.
func ValidateBatch(ops []Op) error {
	for i, op := range ops {
		if op.Kind < OpPut || op.Kind > OpCompareAndDelete {
			return fmt.Errorf("kv: op %d: unknown kind %d", i, op.Kind)
		}
		if len(op.Key) == 0 {
			return fmt.Errorf("kv: op %d: empty key", i)
		}
		if len(op.Key) > MaxKeySize {
			return fmt.Errorf("kv: op %d: key of %d bytes exceeds %d", i, len(op.Key), MaxKeySize)
		}
		if len(op.Value) > MaxValueSize {
			return fmt.Errorf("kv: op %d: value of %d bytes exceeds %d", i, len(op.Value), MaxValueSize)
		}
	}
	return checkDistinctKeys(ops)
}

// pairwiseKeysUpTo is the batch size up to which checkDistinctKeys compares
// keys pairwise: most batches are one request's few writes, where that is
// cheaper than sorting and allocates nothing; a group commit's batch of
// hundreds of keys is sorted.
const pairwiseKeysUpTo = 16

// checkDistinctKeys refuses a batch that names a key twice. It runs on
// every commit of every engine, so it copies no key: a map of the keys
// allocated a string per op.
func checkDistinctKeys(ops []Op) error {
	// second is the later of the two ops naming the key.
	dup := func(second int) error {
		return fmt.Errorf("kv: op %d: key %q appears twice in one batch", second, ops[second].Key)
	}
	if len(ops) <= pairwiseKeysUpTo {
		for j := 1; j < len(ops); j++ {
			for i := 0; i < j; i++ {
				if bytes.Equal(ops[i].Key, ops[j].Key) {
					return dup(j)
				}
			}
		}
		return nil
	}
	idx := make([]int, len(ops))
	for i := range idx {
		idx[i] = i
	}
	// Equal keys sort by position, so of each equal pair the second is the
	// later op.
	slices.SortFunc(idx, func(a, b int) int {
		if c := bytes.Compare(ops[a].Key, ops[b].Key); c != 0 {
			return c
		}
		return a - b
	})
	for k := 1; k < len(idx); k++ {
		if bytes.Equal(ops[idx[k-1]].Key, ops[idx[k]].Key) {
			return dup(idx[k])
		}
	}
	return nil
}
