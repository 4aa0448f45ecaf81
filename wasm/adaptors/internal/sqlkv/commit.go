package sqlkv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/engramkv/engram/wasm/sdk"
)

// Driver is an adaptor's side of the shared logic: its SQL, its driver's
// calls, and what its server's errors mean. Its methods run one statement
// batch each on a connection the caller holds.
type Driver[C Conn] interface {
	// Write begins a READ COMMITTED transaction on c and writes ops in
	// the given order, in as few round trips and statements as it can
	// (Runs); it returns, by position in order, the rows each op's write
	// affected: 1 where a conditional op's condition held. It may roll
	// back and start again before returning, but it does not end the
	// transaction it returns in, even on error.
	Write(c C, ops []sdk.Op, order []int) (affected []int64, err error)
	// Conflict reads key's committed value inside c's transaction and
	// rolls the transaction back.
	Conflict(c C, key []byte) (value []byte, exists bool, err error)
	// Rollback ends a transaction that failed before COMMIT, if c is
	// still open, so that c can be reused.
	Rollback(c C)
	// InTransaction reports whether c is open and inside the transaction
	// Write began: whether COMMIT can apply it.
	InTransaction(c C) bool
	// Commit sends COMMIT and returns its error unclassified.
	Commit(c C) error

	// Stale reports whether err, the failure of the first round trip of a
	// call on c, a connection that was idle in the pool, is c having died
	// while idle, so that the call may run again on a new connection.
	Stale(c C, err error) bool
	// Retryable reports whether err is a transaction the server aborted
	// (a deadlock, a serialization failure) that may succeed if run again.
	Retryable(err error) bool
	// Classify wraps an error of a call that changed nothing with the SDK
	// error that selects its status.
	Classify(err error) error
	// CommitAborted reports whether err, an error of COMMIT, is the
	// server's answer that the transaction was rolled back. Any other
	// error of a sent COMMIT leaves the outcome unknown.
	CommitAborted(err error) bool
}

// errRaced is a failed condition whose key changed back before its current
// value was read, so the conflict cannot be reported faithfully; the batch
// is retried.
var errRaced = errors.New("a failed condition's key changed again before it was read")

// errStale marks an attempt whose pooled connection had died while idle.
var errStale = errors.New("the pooled connection had been closed")

// commitAttempts bounds the retries of a batch the server aborted.
const commitAttempts = 5

// Commit applies ops in one transaction on a connection of p: the
// statements in key order (two batches that touch the same rows lock them
// in the same order, so Engram's own concurrent commits cannot deadlock
// each other); if a condition failed, the current value of the
// lowest-index failing key, read before ROLLBACK; otherwise COMMIT, alone
// in its round trip, so that everything before it failing means nothing
// was applied. Conditions are checked by the writes themselves, which lock
// the row (or the absent key's index slot) and re-check against the newest
// committed version, so READ COMMITTED serialises the batch at COMMIT.
//
// A batch the server aborted is run again, up to commitAttempts times; one
// whose pooled connection had died while idle is run again on a new
// connection without counting. Only a COMMIT without the server's answer
// is UNCERTAIN.
func Commit[C Conn](ctx context.Context, p *Pool[C], d Driver[C], ops []sdk.Op) error {
	order := make([]int, len(ops))
	for i := range order {
		order[i] = i
		switch ops[i].Kind {
		case sdk.OpPut, sdk.OpDelete, sdk.OpPutIfAbsent, sdk.OpCompareAndSwap, sdk.OpCompareAndDelete:
		default:
			return fmt.Errorf("%w: op %d: unknown kind %d", sdk.ErrInvalid, i, ops[i].Kind)
		}
	}
	slices.SortFunc(order, func(a, b int) int { return bytes.Compare(ops[a].Key, ops[b].Key) })
	var err error
	for attempt := 1; ; attempt++ {
		err = commitOnce(ctx, p, d, ops, order)
		if errors.Is(err, errStale) {
			attempt--
			continue
		}
		if err == nil || !(d.Retryable(err) || errors.Is(err, errRaced)) || attempt == commitAttempts {
			break
		}
		if dl, ok := ctx.Deadline(); ok && time.Now().After(dl) {
			break
		}
	}
	if errors.Is(err, errRaced) {
		// Still racing after every attempt: the key keeps flipping.
		// Nothing was applied.
		return fmt.Errorf("commit: %w: %w", sdk.ErrUnavailable, err)
	}
	if err == nil {
		return nil
	}
	var ce *sdk.ConflictError
	if errors.As(err, &ce) || errors.Is(err, sdk.ErrUncertain) {
		return err
	}
	return fmt.Errorf("commit: %w", d.Classify(err))
}

func commitOnce[C Conn](ctx context.Context, p *Pool[C], d Driver[C], ops []sdk.Op, order []int) error {
	c, reused, err := p.Get(ctx)
	if err != nil {
		return err
	}
	// Put discards the connection if it is broken or still in a
	// transaction.
	defer p.Put(c)
	affected, err := d.Write(c, ops, order)
	if err != nil {
		// COMMIT was never sent: nothing is applied.
		d.Rollback(c)
		if reused && d.Stale(c, err) {
			return fmt.Errorf("%w: %w", errStale, err)
		}
		return err
	}
	if len(affected) != len(ops) {
		d.Rollback(c)
		return fmt.Errorf("the server answered %d results to %d statements", len(affected), len(ops))
	}
	failed := -1 // lowest index whose condition failed
	for k, i := range order {
		if ops[i].Kind != sdk.OpPut && ops[i].Kind != sdk.OpDelete && affected[k] != 1 && (failed < 0 || i < failed) {
			failed = i
		}
	}
	if failed >= 0 {
		return conflict(c, d, ops, failed)
	}
	if !d.InTransaction(c) {
		// Checked here, not inferred from COMMIT's error: nothing has
		// been sent yet, so nothing was applied.
		return fmt.Errorf("%w: connection lost before COMMIT", sdk.ErrUnavailable)
	}
	if err := d.Commit(c); err != nil {
		// The driver's own "safe to retry" verdicts are not used: they
		// are about the request's bytes, and COMMIT may have been applied
		// although its answer never came (wasm/adaptors/postgres/postgres_test.go and
		// wasm/adaptors/mysql/mysql_test.go, CommitCuts, cut the connection right after
		// COMMIT to check this).
		if d.CommitAborted(err) {
			return err
		}
		return fmt.Errorf("%w: COMMIT sent, outcome unknown: %v", sdk.ErrUncertain, err)
	}
	return nil
}

// conflict reports the failed condition of ops[index], reading its key's
// current value before rolling back. Under READ COMMITTED the read sees
// the newest committed version, the one the condition was checked against
// or a later one.
func conflict[C Conn](c C, d Driver[C], ops []sdk.Op, index int) error {
	op := &ops[index]
	cur, exists, err := d.Conflict(c, op.Key)
	if err != nil {
		// The batch was not applied either way: the transaction never
		// committed.
		d.Rollback(c)
		return fmt.Errorf("reading the conflicting key of op %d: %w", index, err)
	}
	holds := false
	switch op.Kind {
	case sdk.OpPutIfAbsent:
		holds = !exists
	case sdk.OpCompareAndSwap, sdk.OpCompareAndDelete:
		holds = exists && bytes.Equal(cur, op.Expected)
	}
	if holds {
		return errRaced
	}
	return &sdk.ConflictError{Index: index, Exists: exists, Current: cur}
}

// ClassifyTransport wraps err, an error of a call that changed nothing and
// that is not the server's answer, with the SDK error that selects its
// status: DEADLINE for a timeout (the host's deadline on the socket, which
// a driver may report its own way: timeout), UNAVAILABLE for anything
// else, which is the connection failing (refused, reset, closed). An
// error that already carries an SDK status keeps it.
func ClassifyTransport(err error, timeout bool) error {
	var ne net.Error
	switch {
	case errors.Is(err, sdk.ErrUnavailable), errors.Is(err, sdk.ErrInvalid), errors.Is(err, sdk.ErrDeadline):
		return err
	case timeout, errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", sdk.ErrDeadline, err)
	}
	return fmt.Errorf("%w: %w", sdk.ErrUnavailable, err)
}

// Run is a stretch of a batch in key order whose ops are all of one kind:
// positions From to To (exclusive) of the order Commit passes to Write. An
// adaptor writes a run in one multi-row statement, which keeps the batch's
// rows locked in key order.
type Run struct {
	Kind     sdk.OpKind
	From, To int
}

// Len is the number of ops in r.
func (r Run) Len() int { return r.To - r.From }

// Runs splits order, positions of ops in key order, into runs of one kind.
func Runs(ops []sdk.Op, order []int) []Run {
	var runs []Run
	for k, i := range order {
		if n := len(runs); n > 0 && runs[n-1].Kind == ops[i].Kind {
			runs[n-1].To = k + 1
			continue
		}
		runs = append(runs, Run{Kind: ops[i].Kind, From: k, To: k + 1})
	}
	return runs
}
