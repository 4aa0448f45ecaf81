package tikv_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pingcap/kvproto/pkg/errorpb"
	"github.com/pingcap/kvproto/pkg/kvrpcpb"
	tikvclient "github.com/tikv/client-go/v2/tikv"
	"github.com/tikv/client-go/v2/tikvrpc"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/tikv"
	"github.com/engramkv/engram/engines/tikv/tikvmock"
)

// hook decides the fate of one RPC. It returns handled=false to let the
// request through unchanged.
type hook func(ctx context.Context, req *tikvrpc.Request, send func() (*tikvrpc.Response, error)) (resp *tikvrpc.Response, err error, handled bool)

// faultClient sits between client-go and the mock TiKV and applies the
// installed hook to every request.
type faultClient struct {
	tikvclient.Client
	hook atomic.Pointer[hook]
}

func (c *faultClient) SendRequest(ctx context.Context, addr string, req *tikvrpc.Request, timeout time.Duration) (*tikvrpc.Response, error) {
	send := func() (*tikvrpc.Response, error) { return c.Client.SendRequest(ctx, addr, req, timeout) }
	if h := c.hook.Load(); h != nil {
		if resp, err, handled := (*h)(ctx, req, send); handled {
			return resp, err
		}
	}
	return send()
}

func (c *faultClient) set(h hook) { c.hook.Store(&h) }
func (c *faultClient) clear()     { c.hook.Store(nil) }

// openFaulty opens a mock store (one region, so a batch's keys share the
// primary's commit request) whose RPCs pass through a faultClient.
func openFaulty(t *testing.T) (*tikv.Store, *faultClient) {
	t.Helper()
	fc := &faultClient{}
	s := openMock(t, tikvmock.Options{
		Store:  tikv.Options{RequestTimeout: 10 * time.Second},
		Splits: []string{},
		Hijack: func(c tikvclient.Client) tikvclient.Client { fc.Client = c; return fc },
	})
	t.Cleanup(func() {
		fc.clear()
		_ = s.Close()
	})
	return s, fc
}

var errInjected = errors.New("injected: connection reset by peer")

// onCmd returns a hook that applies f to requests of type cmd only.
func onCmd(cmd tikvrpc.CmdType, f func(send func() (*tikvrpc.Response, error)) (*tikvrpc.Response, error)) hook {
	return func(_ context.Context, req *tikvrpc.Request, send func() (*tikvrpc.Response, error)) (*tikvrpc.Response, error, bool) {
		if req.Type != cmd {
			return nil, nil, false
		}
		resp, err := f(send)
		return resp, err, true
	}
}

// within returns a context for a faulty call: the injected faults last
// until the deadline, which ends client-go's retries.
func within(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func get(t *testing.T, s *tikv.Store, key string) (string, bool) {
	t.Helper()
	v, err := s.Get(context.Background(), []byte(key))
	if errors.Is(err, kv.ErrNotFound) {
		return "", false
	}
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return string(v), true
}

// TestCommitResponseLost: TiKV commits the primary key but client-go
// never gets the answer. The outcome is unknown to the adaptor: it must
// say ErrUncertain, and a read-back must find the batch applied.
func TestCommitResponseLost(t *testing.T) {
	s, fc := openFaulty(t)
	fc.set(onCmd(tikvrpc.CmdCommit, func(send func() (*tikvrpc.Response, error)) (*tikvrpc.Response, error) {
		if _, err := send(); err != nil {
			return nil, err
		}
		return nil, errInjected
	}))
	err := s.Commit(within(t, time.Second), []kv.Op{kv.Put([]byte("a"), []byte("1")), kv.PutIfAbsent([]byte("b"), []byte("2"))})
	fc.clear()
	if !errors.Is(err, kv.ErrUncertain) {
		t.Fatalf("Commit with lost commit responses = %v, want ErrUncertain", err)
	}
	if v, ok := get(t, s, "a"); !ok || v != "1" {
		t.Errorf("read-back of a = %q, %v; want the batch applied", v, ok)
	}
	if v, ok := get(t, s, "b"); !ok || v != "2" {
		t.Errorf("read-back of b = %q, %v; want the batch applied", v, ok)
	}
	if st := s.Stats(); st.Uncertain != 1 {
		t.Errorf("Stats().Uncertain = %d, want 1", st.Uncertain)
	}
}

// TestCommitRequestLost: the commit of the primary key never reaches
// TiKV. The adaptor cannot know that either: ErrUncertain. A read-back
// finds nothing once the orphaned lock expires and is rolled back.
func TestCommitRequestLost(t *testing.T) {
	s, fc := openFaulty(t)
	fc.set(onCmd(tikvrpc.CmdCommit, func(func() (*tikvrpc.Response, error)) (*tikvrpc.Response, error) {
		return nil, errInjected
	}))
	err := s.Commit(within(t, time.Second), []kv.Op{kv.Put([]byte("a"), []byte("1"))})
	fc.clear()
	if !errors.Is(err, kv.ErrUncertain) {
		t.Fatalf("Commit with dropped commit requests = %v, want ErrUncertain", err)
	}
	// The reader meets the prewrite lock, waits out its TTL (3s) and
	// rolls the transaction back.
	if v, ok := get(t, s, "a"); ok {
		t.Errorf("read-back of a = %q; the commit was never sent, want absent", v)
	}
	// The rolled-back transaction must not block later writers.
	if err := s.Commit(context.Background(), []kv.Op{kv.PutIfAbsent([]byte("a"), []byte("2"))}); err != nil {
		t.Errorf("Commit after the rollback: %v", err)
	}
}

// TestCommitRegionErrors: every commit request gets a region error until
// the deadline. client-go itself reports a plain error here (it got
// answers), but whether an earlier attempt landed is not known to the
// adaptor once the commit phase started: ErrUncertain.
func TestCommitRegionErrors(t *testing.T) {
	s, fc := openFaulty(t)
	fc.set(onCmd(tikvrpc.CmdCommit, func(func() (*tikvrpc.Response, error)) (*tikvrpc.Response, error) {
		return &tikvrpc.Response{Resp: &kvrpcpb.CommitResponse{
			RegionError: &errorpb.Error{ServerIsBusy: &errorpb.ServerIsBusy{Reason: "injected"}},
		}}, nil
	}))
	err := s.Commit(within(t, 500*time.Millisecond), []kv.Op{kv.Put([]byte("a"), []byte("1"))})
	fc.clear()
	if !errors.Is(err, kv.ErrUncertain) {
		t.Fatalf("Commit with region errors on commit = %v, want ErrUncertain", err)
	}
}

// TestPrewriteFailure: the transaction fails before its commit point, so
// it certainly did not apply: a plain error, and nothing visible.
func TestPrewriteFailure(t *testing.T) {
	s, fc := openFaulty(t)
	fc.set(onCmd(tikvrpc.CmdPrewrite, func(func() (*tikvrpc.Response, error)) (*tikvrpc.Response, error) {
		return nil, errInjected
	}))
	err := s.Commit(within(t, 500*time.Millisecond), []kv.Op{kv.Put([]byte("a"), []byte("1"))})
	fc.clear()
	if err == nil || errors.Is(err, kv.ErrUncertain) {
		t.Fatalf("Commit with failing prewrites = %v, want a plain error", err)
	}
	if _, ok := kv.AsConflict(err); ok {
		t.Fatalf("Commit with failing prewrites = %v, want a plain error, not a conflict", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Commit error %v does not say the deadline passed", err)
	}
	if v, ok := get(t, s, "a"); ok {
		t.Errorf("a = %q after a failed prewrite, want absent", v)
	}
	if st := s.Stats(); st.Uncertain != 0 || st.Commits != 0 {
		t.Errorf("Stats = %+v, want no commit and nothing uncertain", st)
	}
}

// interleave returns a hook that, on the first prewrite only, commits
// other through s before letting the prewrite through: a writer that
// slipped in between the batch's snapshot and its prewrite.
func interleave(t *testing.T, s *tikv.Store, other []kv.Op) hook {
	var done atomic.Bool
	return onCmd(tikvrpc.CmdPrewrite, func(send func() (*tikvrpc.Response, error)) (*tikvrpc.Response, error) {
		// The interleaved Commit's own prewrite comes through here
		// too, after the flag is set.
		if done.CompareAndSwap(false, true) {
			if err := s.Commit(context.Background(), other); err != nil {
				t.Errorf("interleaved Commit: %v", err)
			}
		}
		return send()
	})
}

// TestWriteConflictRechecksConditions: a CAS whose key changes between the
// snapshot and the prewrite gets a write conflict from TiKV. The adaptor
// must not leak it: it re-runs the batch, the condition now fails, and the
// caller gets a ConflictError with the new value.
func TestWriteConflictRechecksConditions(t *testing.T) {
	s, fc := openFaulty(t)
	ctx := context.Background()
	if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte("v0"))}); err != nil {
		t.Fatal(err)
	}
	fc.set(interleave(t, s, []kv.Op{kv.Put([]byte("k"), []byte("other"))}))
	err := s.Commit(ctx, []kv.Op{kv.Put([]byte("x"), []byte("1")), kv.CompareAndSwap([]byte("k"), []byte("v0"), []byte("mine"))})
	fc.clear()
	c, ok := kv.AsConflict(err)
	if !ok {
		t.Fatalf("Commit racing a writer = %v, want a ConflictError", err)
	}
	if c.Index != 1 || !c.Exists || string(c.Current) != "other" {
		t.Errorf("ConflictError = %+v, want index 1, current %q", c, "other")
	}
	if v, ok := get(t, s, "x"); ok {
		t.Errorf("x = %q: part of a conflicting batch landed", v)
	}
	if st := s.Stats(); st.Retries != 1 {
		t.Errorf("Stats().Retries = %d, want 1", st.Retries)
	}
}

// TestWriteConflictRetriesBlindWrites: a batch without conditions that
// meets a write conflict is simply re-run, and lands.
func TestWriteConflictRetriesBlindWrites(t *testing.T) {
	s, fc := openFaulty(t)
	ctx := context.Background()
	fc.set(interleave(t, s, []kv.Op{kv.Put([]byte("k"), []byte("other"))}))
	err := s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte("mine")), kv.Delete([]byte("gone"))})
	fc.clear()
	if err != nil {
		t.Fatalf("Commit racing a writer: %v", err)
	}
	if v, _ := get(t, s, "k"); v != "mine" {
		t.Errorf("k = %q, want %q (the retried batch is the later write)", v, "mine")
	}
	if st := s.Stats(); st.Retries != 1 || st.Commits != 2 {
		t.Errorf("Stats = %+v, want 1 retry and 2 commits", st)
	}
}

// TestCommitCancelled: a context that ends before the commit point means
// "not applied", reported with the context's error.
func TestCommitCancelled(t *testing.T) {
	s := openMock(t, tikvmock.Options{})
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Commit(ctx, []kv.Op{kv.Put([]byte("k"), []byte("v"))})
	if !errors.Is(err, context.Canceled) || errors.Is(err, kv.ErrUncertain) {
		t.Errorf("Commit with a cancelled context = %v, want a not-applied context error", err)
	}
	if v, ok := get(t, s, "k"); ok {
		t.Errorf("cancelled batch landed: %q", v)
	}
}
