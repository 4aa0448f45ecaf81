package kvtest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/engramkv/engram/core/kv"
)

// caseClose checks that Close waits out concurrent work and that every
// call made after it fails with ErrClosed rather than panicking or touching
// released engine memory.
//
// Whether a Commit is inside the adaptor at the instant Close begins cannot
// be observed through kv.Store, so the case does not try to time it.
// Instead every writer commits in a loop that only ErrClosed ends, and Close
// is called only once each writer has landed a commit: each writer's calls
// then straddle Close on any machine, however loaded. The calls before Close
// land, the ones racing it land or fail with ErrClosed, and one begun after
// Close returned must fail with ErrClosed.
func caseClose(ctx context.Context, t T, s kv.Store) {
	mustCommit(ctx, t, s, kv.Put([]byte("c/a"), []byte("1")), kv.Put([]byte("c/b"), []byte("2")))
	it, err := s.Scan(ctx, kv.ScanOptions{BatchSize: 1})
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	if b, err := it.Next(ctx); err != nil || len(b) != 1 {
		t.Fatalf("Next = %d pairs, %v", len(b), err)
	}

	const writers = 4
	var (
		wg sync.WaitGroup
		// running receives one value per writer: after its first commit
		// landed, or when it gave up before that.
		running = make(chan struct{}, writers)
		// closeCalled is set just before Close is called, closeReturned
		// just after it returned.
		closeCalled, closeReturned atomic.Bool
		// inCommit counts writers between calling and returning from Commit.
		inCommit            atomic.Int64
		landed, duringClose atomic.Int64
	)
	for g := range writers {
		spawn(t, &wg, func() {
			signalled := false
			signal := func() {
				if !signalled {
					signalled = true
					running <- struct{}{}
				}
			}
			defer signal()
			for i := 0; ; i++ {
				begunAfterClose := closeReturned.Load()
				inCommit.Add(1)
				err := s.Commit(ctx, []kv.Op{kv.Put(key("c/w/%d/%d", g, i), []byte("x"))})
				inCommit.Add(-1)
				switch {
				case errors.Is(err, kv.ErrClosed) && !signalled:
					t.Errorf("writer %d: Commit before Close was called = %v", g, err)
					return
				case errors.Is(err, kv.ErrClosed):
					return
				case err != nil:
					t.Errorf("writer %d: Commit racing Close = %v, want nil or ErrClosed", g, err)
					return
				case begunAfterClose:
					t.Errorf("writer %d: Commit begun after Close returned = nil, want ErrClosed", g)
					return
				}
				landed.Add(1)
				if closeCalled.Load() {
					duringClose.Add(1)
				}
				signal()
				// Only a store that neither closes nor fails could keep a
				// writer here; the case's deadline ends it.
				if ctx.Err() != nil {
					t.Errorf("writer %d: Commit still succeeding at the case's deadline: %v", g, ctx.Err())
					return
				}
			}
		})
	}
	for range writers {
		<-running
	}
	inFlight := inCommit.Load()
	closeCalled.Store(true)
	if err := s.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	closeReturned.Store(true)
	wg.Wait()

	if _, err := s.Get(ctx, []byte("c/a")); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Get after Close = %v, want ErrClosed", err)
	}
	if it2, err := s.Scan(ctx, kv.ScanOptions{}); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Scan after Close = %v, want ErrClosed", err)
		if it2 != nil {
			_ = it2.Close()
		}
	}
	if err := s.Commit(ctx, []kv.Op{kv.Put([]byte("c/c"), nil)}); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Commit after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Partitions(ctx, nil, nil); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Partitions after Close = %v, want ErrClosed", err)
	}
	if b, err := it.Next(ctx); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Next on an iterator that outlived its store = %d pairs, %v; want ErrClosed", len(b), err)
	}
	if err := it.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Iterator.Close after store Close = %v", err)
	}
	if err := it.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
		t.Errorf("second Iterator.Close = %v", err)
	}
	if err := s.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
		t.Errorf("second Close = %v, want nil or ErrClosed", err)
	}
	t.Logf("%d commits landed, %d after Close was called; %d of %d writers were inside Commit just before it", landed.Load(), duringClose.Load(), inFlight, writers)
}
