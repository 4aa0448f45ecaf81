package tikv

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/engramkv/engram/core/kv"
)

// countingStats answers fixed statistics (or err) and records the calls.
type countingStats struct {
	mu         sync.Mutex
	st         RegionStats
	err        error
	calls      int
	start, end []byte
}

func (c *countingStats) RegionStats(ctx context.Context, start, end []byte) (RegionStats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	c.start, c.end = start, end
	return c.st, c.err
}

func (c *countingStats) set(bytes int64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.Bytes, c.err = bytes, err
}

func (c *countingStats) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// fakeClock is a time that moves only when the test says.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestSize: Size asks the source about exactly the namespace, reuses a
// measure for a second and a failure for ten by the injected clock, then
// asks again; after Close it refuses as every call does.
func TestSize(t *testing.T) {
	src := &countingStats{st: RegionStats{Bytes: 3 << 20}}
	clock := &fakeClock{now: time.Unix(1000, 0)}
	s := newMock(t, Options{Prefix: []byte("ns/"), RegionStats: src, Clock: clock.Now})

	size := func() (int64, error) { t.Helper(); return s.Size() }
	if n, err := size(); n != 3<<20 || err != nil {
		t.Fatalf("Size = %d, %v; want 3 MiB", n, err)
	}
	if !bytes.Equal(src.start, []byte("ns/")) || !bytes.Equal(src.end, []byte("ns0")) {
		t.Errorf("asked about [%q, %q), want the namespace [\"ns/\", \"ns0\")", src.start, src.end)
	}
	src.set(5<<20, nil)
	clock.Advance(sizeCacheTTL - time.Nanosecond)
	if n, _ := size(); n != 3<<20 || src.count() != 1 {
		t.Errorf("within the second: Size = %d after %d requests, want the first measure, 1 request", n, src.count())
	}
	clock.Advance(time.Nanosecond)
	if n, _ := size(); n != 5<<20 || src.count() != 2 {
		t.Errorf("after the second: Size = %d after %d requests, want 5 MiB, 2 requests", n, src.count())
	}

	pdDown := errors.New("PD region statistics: connection refused")
	src.set(0, pdDown)
	clock.Advance(sizeCacheTTL)
	for range 2 {
		if _, err := size(); !errors.Is(err, pdDown) || !strings.Contains(err.Error(), `size of "ns/"`) {
			t.Errorf("Size with PD down: %v", err)
		}
	}
	src.set(6<<20, nil)
	clock.Advance(sizeFailureTTL - time.Nanosecond)
	if _, err := size(); !errors.Is(err, pdDown) || src.count() != 3 {
		t.Errorf("a failure was not reused for %v: %v after %d requests", sizeFailureTTL, err, src.count())
	}
	clock.Advance(time.Nanosecond)
	if n, err := size(); n != 6<<20 || err != nil {
		t.Errorf("after a failure's reuse: Size = %d, %v", n, err)
	}
	// A clock that goes back does not pin a measure forever.
	src.set(7<<20, nil)
	clock.Advance(-time.Hour)
	if n, err := size(); n != 7<<20 || err != nil {
		t.Errorf("after the clock went back: Size = %d, %v", n, err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Size(); !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Size after Close: %v, want kv.ErrClosed", err)
	}
}

// TestSizeWithoutSource: a store made by New without a source cannot tell
// its size, and says why.
func TestSizeWithoutSource(t *testing.T) {
	s := newMock(t, Options{})
	if _, err := s.Size(); err == nil || !strings.Contains(err.Error(), "no region statistics source") {
		t.Errorf("Size = %v, want an error naming the missing source", err)
	}
}
