package mvcc

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestReadBarrierNeverServesAStaleFetch: every read must get a fetch that
// started after it arrived, and concurrent reads must share fetches. It runs
// in a synctest bubble, where time is fake and moves only when every
// goroutine of the test is blocked: so while a fetch takes its time, every
// reader arrives, and how they overlap does not depend on the machine.
func TestReadBarrierNeverServesAStaleFetch(t *testing.T) {
	synctest.Test(t, testReadBarrier)
}

func testReadBarrier(t *testing.T) {
	var started atomic.Int64 // fetches started
	r := &readBarrier{fetch: func(context.Context) (int64, int64, error) {
		n := started.Add(1)
		// A store round trip; fake time in the bubble, so it costs
		// nothing and lasts until every reader has arrived.
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
	// Every reader arrives while a fetch runs, so each of its 20 reads
	// waits for at most the next fetch: 64 readers share two fetches a
	// round.
	if n := started.Load(); n > 2*20 {
		t.Errorf("%d fetches for %d reads, want at most %d", n, 64*20, 2*20)
	}
}
