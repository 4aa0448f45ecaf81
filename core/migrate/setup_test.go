package migrate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/internal/mvcc/transfer"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/migrate"
	"github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/internal/etcdtest"
)

// leaseTTL is the TTL of every lease the tests grant: long enough that no
// lease expires while a test runs, so the source changes only when a test
// writes.
const leaseTTL = 3600

// testCtx is a context that ends with the test or after d, whichever is
// first: every wait in these tests is bounded by it.
func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// dial connects to an etcd v3 endpoint (etcd or Engram), closed at cleanup.
func dial(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:          []string{endpoint},
		DialTimeout:        5 * time.Second,
		Logger:             zap.NewNop(),
		MaxCallRecvMsgSize: 64 << 20,
	})
	if err != nil {
		t.Fatalf("dial %s: %v", endpoint, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// startSource starts a real etcd 3.6 and returns it with a client.
func startSource(t testing.TB) (*etcdtest.Etcd, *clientv3.Client) {
	t.Helper()
	e := etcdtest.Start(t, etcdtest.Options{})
	return e, dial(t, e.Endpoint)
}

// openBadger opens a badger store in dir (t.TempDir() when empty), closed
// at cleanup unless the test closed it already.
func openBadger(t testing.TB, dir string) *badger.Store {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	st, err := badger.Open(badger.Options{Dir: dir})
	if err != nil {
		t.Fatalf("open badger: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
			t.Errorf("close badger: %v", err)
		}
	})
	return st
}

// requireUnservable checks that the store holds an unfinished import, so
// no server opens it.
func requireUnservable(t testing.TB, st kv.Store) *mvcc.ImportRecord {
	t.Helper()
	ctx := testCtx(t, 30*time.Second)
	b, err := mvcc.Open(ctx, mvcc.Options{Store: st, ReadOnly: true})
	if err == nil {
		_ = b.Close()
		t.Fatal("mvcc.Open accepted a store whose migration did not finish")
	}
	if !errors.Is(err, mvcc.ErrImportUnfinished) {
		t.Fatalf("mvcc.Open: %v, want ErrImportUnfinished", err)
	}
	rec, err := mvcc.ReadImportRecord(ctx, st)
	if err != nil || rec == nil {
		t.Fatalf("import record: %v, %v", rec, err)
	}
	return rec
}

// runResult is what a migration run in the background returned.
type runResult struct {
	res migrate.Result
	err error
}

// runAsync runs migrate.Run in a goroutine; the test waits for its result
// on the returned channel (the goroutine ends with ctx at the latest).
func runAsync(ctx context.Context, opts migrate.Options, cutover <-chan struct{}) <-chan runResult {
	ch := make(chan runResult, 1)
	go func() {
		res, err := migrate.Run(ctx, opts, cutover)
		ch <- runResult{res, err}
	}()
	return ch
}

// waitRun waits for a background migration's result, at most d.
func waitRun(t testing.TB, ch <-chan runResult, d time.Duration) runResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("migrate.Run did not return within %v", d)
		return runResult{}
	}
}

// closed is a closed cut-over channel: cut over as soon as caught up.
func closed() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// contains reports whether s contains every one of subs.
func contains(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// mvccCheckEmpty returns an error unless st holds nothing an import writes.
func mvccCheckEmpty(ctx context.Context, st kv.Store) error { return transfer.CheckEmpty(ctx, st) }
