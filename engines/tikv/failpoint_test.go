package tikv_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pingcap/failpoint"
	"github.com/tikv/client-go/v2/tikvrpc"
	"github.com/tikv/client-go/v2/util"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/tikv"
	"github.com/engramkv/engram/engines/tikv/tikvmock"
)

// The tests in this file drive client-go's own failpoints (switched on for
// this binary in TestMain), where fault_test.go replaces RPC answers from
// outside. A failpoint fails client-go at a named point of its two-phase
// commit or of its request sender, so the adaptor meets the errors that
// client-go itself produces there, with client-go's own clean-up and retry
// behind them, and not an imitation of them.
//
// Several of client-go's commit-path failpoints fire only for a
// transaction that carries a session id in its context (TiDB's sessions
// do); sessionCtx adds one, as a caller's context would carry it into
// Commit.

// enableFailpoint switches a client-go failpoint on for the rest of the
// test. Failpoints are process-wide: tests that use them must not run in
// parallel with other tests of this package.
func enableFailpoint(t *testing.T, name, terms string) {
	t.Helper()
	full := "tikvclient/" + name
	if err := failpoint.Enable(full, terms); err != nil {
		t.Fatalf("enable failpoint %s: %v", full, err)
	}
	t.Cleanup(func() { _ = failpoint.Disable(full) })
}

func sessionCtx(t *testing.T, d time.Duration) context.Context {
	return context.WithValue(within(t, d), util.SessionID, uint64(1))
}

// requireRolledBack checks that none of keys is visible and that a new
// writer of the first one is not blocked by what the failed transaction
// left behind (its locks are resolved, by rollback, when met).
func requireRolledBack(t *testing.T, s *tikv.Store, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if v, ok := get(t, s, k); ok {
			t.Errorf("%s = %q after a transaction that did not commit, want absent", k, v)
		}
	}
	if err := s.Commit(within(t, 10*time.Second), []kv.Op{kv.PutIfAbsent([]byte(keys[0]), []byte("later"))}); err != nil {
		t.Errorf("a later create of %s: %v", keys[0], err)
	}
}

// TestFailpointCommitResponseLost: client-go's rpcFailOnRecv drops
// answers to transactional writes after TiKV applied them, armed the
// moment the primary's commit goes out (so the prewrite is untouched).
// Dropped once, client-go's request sender retries the commit, which TiKV
// applies idempotently: Commit succeeds. Dropped until the deadline,
// client-go reports the result undetermined: the adaptor says
// ErrUncertain. Either way a read-back finds the batch applied.
func TestFailpointCommitResponseLost(t *testing.T) {
	for _, tc := range []struct {
		name, terms string
		uncertain   bool
	}{
		{"once", `1*return("write")`, false},
		{"until the deadline", `return("write")`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, fc := openFaulty(t)
			var commits atomic.Int32
			fc.set(onCmd(tikvrpc.CmdCommit, func(send func() (*tikvrpc.Response, error)) (*tikvrpc.Response, error) {
				if commits.Add(1) == 1 {
					enableFailpoint(t, "rpcFailOnRecv", tc.terms)
				}
				return send()
			}))
			err := s.Commit(within(t, time.Second), []kv.Op{kv.Put([]byte("a"), []byte("1")), kv.Put([]byte("b"), []byte("2"))})
			// The read-back below resolves locks with transactional
			// writes, whose answers must not be dropped.
			_ = failpoint.Disable("tikvclient/rpcFailOnRecv")
			fc.clear()
			// The commit was sent again after the dropped answer: the
			// failpoint fired and client-go retried.
			if n := commits.Load(); n < 2 {
				t.Errorf("%d commit requests sent, want a retry after the dropped answer", n)
			}
			switch {
			case tc.uncertain && !errors.Is(err, kv.ErrUncertain):
				t.Fatalf("Commit whose commit answers client-go dropped = %v, want ErrUncertain", err)
			case !tc.uncertain && err != nil:
				t.Fatalf("Commit whose commit answer client-go dropped once = %v, want success", err)
			}
			for k, want := range map[string]string{"a": "1", "b": "2"} {
				if v, ok := get(t, s, k); !ok || v != want {
					t.Errorf("read-back of %s = %q, %v; want %q: TiKV applied the commit", k, v, ok, want)
				}
			}
		})
	}
}

// TestFailpointFailureBeforeCommit: client-go's beforeCommit fails the
// transaction after every key was prewritten and the commit timestamp
// fetched, before the primary's commit is sent. The adaptor has then
// passed its commit-point observation (classify), so it must say
// ErrUncertain, never "not applied" by guess; the truth, found by the
// read-back, is that nothing was applied, and the orphaned locks do not
// block the next writer.
func TestFailpointFailureBeforeCommit(t *testing.T) {
	s, _ := openFaulty(t)
	enableFailpoint(t, "beforeCommit", `1*return("fail")`)
	err := s.Commit(sessionCtx(t, 5*time.Second), []kv.Op{kv.Put([]byte("a"), []byte("1")), kv.Put([]byte("b"), []byte("2"))})
	if !errors.Is(err, kv.ErrUncertain) {
		t.Fatalf("Commit failed by client-go before its commit = %v, want ErrUncertain", err)
	}
	requireRolledBack(t, s, "a", "b")
}

// TestFailpointPrewriteErrors: client-go fails the prewrite of the
// primary's batch, or of a secondary region's batch, which it does
// concurrently. Before the commit point nothing can be applied: a plain
// error, never ErrUncertain, nothing visible, nothing left blocking.
func TestFailpointPrewriteErrors(t *testing.T) {
	for _, fp := range []string{"prewritePrimaryFail", "prewriteSecondaryFail"} {
		t.Run(fp, func(t *testing.T) {
			// Default splits: "a" and "u" live in different regions, so
			// the batch has a primary and a secondary prewrite batch.
			s := openMock(t, tikvmock.Options{Store: tikv.Options{RequestTimeout: 10 * time.Second}})
			t.Cleanup(func() { _ = s.Close() })
			enableFailpoint(t, fp, `1*return(true)`)
			err := s.Commit(sessionCtx(t, 5*time.Second), []kv.Op{kv.Put([]byte("a"), []byte("1")), kv.Put([]byte("u"), []byte("2"))})
			if err == nil || errors.Is(err, kv.ErrUncertain) {
				t.Fatalf("Commit with %s = %v, want a plain error", fp, err)
			}
			requireRolledBack(t, s, "a", "u")
		})
	}
}

// TestFailpointCommitErrorBeforeTwoPhase: client-go's mockCommitError
// fails the commit before two-phase commit starts: a plain error.
func TestFailpointCommitErrorBeforeTwoPhase(t *testing.T) {
	s, _ := openFaulty(t)
	enableFailpoint(t, "mockCommitError", `return(true)`)
	enableFailpoint(t, "mockCommitErrorOpt", `return(true)`)
	err := s.Commit(within(t, 5*time.Second), []kv.Op{kv.Put([]byte("a"), []byte("1"))})
	if err == nil || errors.Is(err, kv.ErrUncertain) {
		t.Fatalf("Commit with mockCommitError = %v, want a plain error", err)
	}
	requireRolledBack(t, s, "a")
}

// TestFailpointStoreTimeouts: client-go's tikvStoreSendReqResult makes
// every request to TiKV time out. Reads and commits must fail within the
// caller's deadline with an error (a commit certainly not applied, since
// no prewrite got through), and work again once TiKV answers.
func TestFailpointStoreTimeouts(t *testing.T) {
	s, _ := openFaulty(t)
	if err := s.Commit(within(t, 5*time.Second), []kv.Op{kv.Put([]byte("a"), []byte("1"))}); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	full := "tikvclient/tikvStoreSendReqResult"
	if err := failpoint.Enable(full, `return("timeout")`); err != nil {
		t.Fatal(err)
	}
	_, getErr := s.Get(within(t, 300*time.Millisecond), []byte("a"))
	commitErr := s.Commit(within(t, 300*time.Millisecond), []kv.Op{kv.Put([]byte("b"), []byte("2"))})
	if err := failpoint.Disable(full); err != nil {
		t.Fatal(err)
	}
	if getErr == nil {
		t.Errorf("Get while every TiKV request times out: no error")
	}
	if commitErr == nil || errors.Is(commitErr, kv.ErrUncertain) {
		t.Errorf("Commit while every TiKV request times out = %v, want a plain error", commitErr)
	}
	if v, ok := get(t, s, "a"); !ok || v != "1" {
		t.Errorf("a = %q, %v after the timeouts, want 1", v, ok)
	}
	requireRolledBack(t, s, "b")
}
