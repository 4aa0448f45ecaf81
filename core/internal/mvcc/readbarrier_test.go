package mvcc

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestReadBarrierNeverServesAStaleFetch: every read must get a fetch that
// started after it arrived, and concurrent reads must share fetches.
func TestReadBarrierNeverServesAStaleFetch(t *testing.T) {
	var started atomic.Int64 // fetches started
	r := &readBarrier{fetch: func(context.Context) (int64, int64, error) {
		n := started.Add(1)
		time.Sleep(2 * time.Millisecond)
		return n, 0, nil
	}}
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				// Fetches started before this read are numbered <= before.
				before := started.Load()
				got, _, err := r.wait(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				if got <= before {
					t.Errorf("read that arrived after fetch %d was served by fetch %d", before, got)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := started.Load(); n >= 64*20 {
		t.Errorf("%d fetches for %d reads: none shared", n, 64*20)
	} else {
		t.Logf("%d reads served by %d fetches", 64*20, n)
	}
}
