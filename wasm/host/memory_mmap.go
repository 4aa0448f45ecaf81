//go:build linux || darwin

package host

import (
	"math"
	"syscall"

	"github.com/tetratelabs/wazero/experimental"
)

// mmapAllocator backs each instance's linear memory with an anonymous
// mapping of the memory's maximum size, reserved but not committed: pages
// cost RSS only once the guest touches them, as before. wazero's default
// keeps linear memory in a Go slice and grows it with append, so a guest
// whose heap grows has its whole memory copied again and again, and holds
// it in the Go heap, where it paces the host's garbage collector (DESIGN.md,
// "Linear memory outside the Go heap"). A mapping never moves and sits
// outside the Go heap, like a C allocator's memory.
//
// Memory of a closed module is unmapped: nothing in the host keeps a view of
// guest memory past a call (responses are copied before the instance is
// released, host functions finish within the call), and wazero defers
// freeing a module closed asynchronously (Options.Untrusted) until its call
// has returned.
type mmapAllocator struct{}

func (mmapAllocator) Allocate(_, max uint64) experimental.LinearMemory {
	if max == 0 || max > 1<<32 || max > math.MaxInt {
		return &heapMemory{}
	}
	buf, err := syscall.Mmap(-1, 0, int(max), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		// Address space is short (a ulimit, a 32-bit host): fall back
		// to the Go heap.
		return &heapMemory{}
	}
	return &mmapMemory{buf: buf}
}

type mmapMemory struct{ buf []byte }

// Reallocate grows the memory in place; the kernel zero-fills pages on
// first touch, as wasm requires of new pages.
func (m *mmapMemory) Reallocate(size uint64) []byte {
	if m.buf == nil || size > uint64(len(m.buf)) {
		return nil
	}
	return m.buf[:size:size]
}

func (m *mmapMemory) Free() {
	if m.buf != nil {
		_ = syscall.Munmap(m.buf)
		m.buf = nil
	}
}
