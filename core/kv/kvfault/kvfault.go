// Package kvfault wraps a kv.Store to inject faults on chosen calls: errors,
// uncertain commit results (applied or not), and delays. It exists for tests
// of the layers above the adaptor contract; it must never be used in a
// serving path.
//
// It is public so that tests outside the core (the linearizability runs,
// an adaptor's own tests) can drive the same faults.
package kvfault

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/engramkv/engram/core/kv"
)

// Fault is what happens to one intercepted Commit or Get.
type Fault struct {
	// Err is returned instead of calling the store (for Commit: the batch is
	// not applied), unless Apply is set.
	Err error
	// Apply makes a Commit fault apply the batch first and then return Err,
	// which models "timed out after the engine committed".
	Apply bool
	// Delay is slept before the call.
	Delay time.Duration
}

// Store is a kv.Store with injectable faults. The zero faults pass through.
type Store struct {
	kv.Store

	mu      sync.Mutex
	commits []Fault
	gets    []Fault
	// down, when set, fails every call (a partition from the store).
	down error
	// Commits counts Commit calls that reached the wrapper.
	commitCalls int
}

// Wrap returns s with fault injection.
func Wrap(s kv.Store) *Store { return &Store{Store: s} }

// Partition makes every call fail with err (nothing is applied) until Heal.
func (s *Store) Partition(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = err
}

// Heal ends a Partition.
func (s *Store) Heal() { s.Partition(nil) }

func (s *Store) isDown() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.down
}

// Scan fails while partitioned.
func (s *Store) Scan(ctx context.Context, opts kv.ScanOptions) (kv.Iterator, error) {
	if err := s.isDown(); err != nil {
		return nil, err
	}
	return s.Store.Scan(ctx, opts)
}

// FailCommits queues faults for the next Commit calls, one each.
func (s *Store) FailCommits(f ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commits = append(s.commits, f...)
}

// FailGets queues faults for the next Get calls, one each.
func (s *Store) FailGets(f ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gets = append(s.gets, f...)
}

// CommitCalls returns how many Commit calls were made.
func (s *Store) CommitCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commitCalls
}

func (s *Store) next(q *[]Fault) (Fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(*q) == 0 {
		return Fault{}, false
	}
	f := (*q)[0]
	*q = (*q)[1:]
	return f, true
}

// Commit applies the next queued commit fault, if any.
func (s *Store) Commit(ctx context.Context, ops []kv.Op) error {
	s.mu.Lock()
	s.commitCalls++
	down := s.down
	s.mu.Unlock()
	if down != nil {
		return down
	}
	f, ok := s.next(&s.commits)
	if !ok {
		return s.Store.Commit(ctx, ops)
	}
	if f.Delay > 0 {
		time.Sleep(f.Delay)
	}
	if f.Err == nil {
		return s.Store.Commit(ctx, ops)
	}
	if f.Apply {
		if err := s.Store.Commit(ctx, ops); err != nil {
			return fmt.Errorf("kvfault: applying before injected error: %w", err)
		}
	}
	return f.Err
}

// Get applies the next queued get fault, if any.
func (s *Store) Get(ctx context.Context, key []byte) ([]byte, error) {
	if err := s.isDown(); err != nil {
		return nil, err
	}
	f, ok := s.next(&s.gets)
	if ok {
		if f.Delay > 0 {
			time.Sleep(f.Delay)
		}
		if f.Err != nil {
			return nil, f.Err
		}
	}
	return s.Store.Get(ctx, key)
}
