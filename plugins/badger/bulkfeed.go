package badger

import (
	"fmt"
	"sync"

	badgerdb "github.com/dgraph-io/badger/v3"
	"github.com/dgraph-io/ristretto/z"
)

// streamFeed hands a load's filled buffers to the StreamWriter on a
// goroutine of its own, so that the StreamWriter's decoding of a buffer
// (every pair unmarshalled and copied into an entry before it reaches a
// table builder) overlaps with the caller filling the next one. Two
// buffers take turns.
type streamFeed struct {
	sw *badgerdb.StreamWriter
	// written is called after each buffer is written, with its size.
	written func(n int) error
	full    chan *z.Buffer
	free    chan *z.Buffer
	done    chan struct{}
	stopped bool

	mu  sync.Mutex
	err error
}

func newStreamFeed(sw *badgerdb.StreamWriter, spare *z.Buffer, written func(int) error) *streamFeed {
	f := &streamFeed{sw: sw, written: written, full: make(chan *z.Buffer, 1), free: make(chan *z.Buffer, 2), done: make(chan struct{})}
	f.free <- spare
	go f.run()
	return f
}

func (f *streamFeed) run() {
	defer close(f.done)
	for b := range f.full {
		// After a failure the buffers still come back, unwritten: the
		// caller learns of it at its next hand-over.
		if f.error() == nil {
			n := b.LenNoPadding()
			err := f.sw.Write(b)
			if err != nil {
				err = fmt.Errorf("badger: bulk load: write: %w", err)
			} else {
				err = f.written(n)
			}
			if err != nil {
				f.mu.Lock()
				f.err = err
				f.mu.Unlock()
			}
		}
		b.Reset()
		f.free <- b
	}
}

func (f *streamFeed) error() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// swap hands b over to be written and returns an empty buffer, once one
// is free; the error is that of an earlier write.
func (f *streamFeed) swap(b *z.Buffer) (*z.Buffer, error) {
	f.full <- b
	next := <-f.free
	return next, f.error()
}

// stop waits for the buffers handed over to be written and ends the
// goroutine; the StreamWriter is then the caller's alone. It returns the
// first write's error. Later calls only return it again.
func (f *streamFeed) stop() error {
	if !f.stopped {
		f.stopped = true
		close(f.full)
		<-f.done
	}
	return f.error()
}

// release frees the buffers the feed holds; call it after stop.
func (f *streamFeed) release() {
	for {
		select {
		case b := <-f.free:
			_ = b.Release()
		default:
			return
		}
	}
}
