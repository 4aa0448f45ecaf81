package snapshot

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
)

// hashChunk is how much of the file the deferred check reads at a time.
const hashChunk = 4 << 20

// errHashStopped ends a deferred check that Close no longer waits for.
var errHashStopped = errors.New("hash check stopped: the file was closed")

// hashCheck is a sha256 trailer check running on a goroutine of its own
// while the caller reads the file (OpenOptions.DeferHashCheck).
type hashCheck struct {
	done chan struct{}
	// err is the check's result, set before done is closed.
	err error
	// failed is set with err when the check fails: the reads poll it to
	// stop early on a damaged file.
	failed atomic.Bool
	stop   atomic.Bool
}

// startHashCheck checks in the background that the sha256 of the first
// dataSize bytes of the file at path is want.
func startHashCheck(path string, dataSize int64, want []byte) *hashCheck {
	c := &hashCheck{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		if err := c.run(path, dataSize, want); err != nil {
			c.err = err
			c.failed.Store(true)
		}
	}()
	return c
}

func (c *hashCheck) run(path string, dataSize int64, want []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("hash: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, hashChunk)
	for off := int64(0); off < dataSize; {
		if c.stop.Load() {
			return errHashStopped
		}
		n, err := f.ReadAt(buf[:min(int64(len(buf)), dataSize-off)], off)
		if err != nil {
			return fmt.Errorf("hash: %w", err)
		}
		h.Write(buf[:n])
		off += int64(n)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		return fmt.Errorf("%w: trailer %x, database %x", ErrHashMismatch, want, got)
	}
	return nil
}

// wait returns the check's result once it is known.
func (c *hashCheck) wait() error {
	<-c.done
	return c.err
}

// cancel stops the check and waits for its goroutine.
func (c *hashCheck) cancel() {
	c.stop.Store(true)
	<-c.done
}
