package badger

import (
	"fmt"

	badgerdb "github.com/dgraph-io/badger/v3"
	"github.com/dgraph-io/ristretto/z"
)

// loadWriter runs a load's StreamWriter Writes on a goroutine of its own,
// two buffers taking turns: while it writes one (badger unmarshals every
// pair of it and copies each into an entry, a third of a restore's load on
// the caller's goroutine), the caller fills the other. The caller waits
// only when it fills its buffer before the last one is written, so memory
// stays at two buffers. DESIGN.md, "Bulk restore", has the measurements.
//
// Invariants: only the goroutine calls sw.Write; nothing calls anything
// else of sw until stop has returned, which waits for the Write under
// way; the goroutine never waits on the store's gate, so stop may be
// called with the gate held.
type loadWriter struct {
	sw *badgerdb.StreamWriter
	// full carries filled buffers to the goroutine; free brings them back
	// written and reset (its capacity holds both, so the goroutine never
	// waits to hand one back).
	full, free chan *z.Buffer
	done       chan struct{}
	// err is the first Write's error. The goroutine sets it before it
	// hands the buffer back, and the caller reads it after receiving one
	// (or after done), so the channels order the two.
	err     error
	stopped bool
}

func startLoadWriter(sw *badgerdb.StreamWriter) *loadWriter {
	w := &loadWriter{sw: sw, full: make(chan *z.Buffer, 1), free: make(chan *z.Buffer, 2), done: make(chan struct{})}
	w.free <- newLoadBuffer()
	go w.run()
	return w
}

func (w *loadWriter) run() {
	defer close(w.done)
	for buf := range w.full {
		if w.err == nil {
			if err := w.sw.Write(buf); err != nil {
				w.err = fmt.Errorf("badger: bulk load: write: %w", err)
			}
		}
		buf.Reset()
		w.free <- buf
	}
}

// swap hands buf to the goroutine and returns an empty buffer once one is
// free, with the error of any Write so far. After stop it keeps buf.
func (w *loadWriter) swap(buf *z.Buffer) (*z.Buffer, error) {
	if w.stopped {
		return buf, fmt.Errorf("badger: bulk load: write after the load's writer stopped")
	}
	w.full <- buf
	next := <-w.free
	return next, w.err
}

// stop waits for the buffers handed over to be written and ends the
// goroutine; it returns the first Write's error. Calls after the first
// return that error again.
func (w *loadWriter) stop() error {
	if !w.stopped {
		w.stopped = true
		close(w.full)
		<-w.done
	}
	return w.err
}

// release frees the buffers the goroutine handed back; it is called after
// stop.
func (w *loadWriter) release() {
	for {
		select {
		case buf := <-w.free:
			_ = buf.Release()
		default:
			return
		}
	}
}
