//go:build !linux && !darwin

package host

import "github.com/tetratelabs/wazero/experimental"

// mmapAllocator keeps linear memory in the Go heap on systems where the
// mapping of memory_mmap.go is not implemented.
type mmapAllocator struct{}

func (mmapAllocator) Allocate(_, _ uint64) experimental.LinearMemory { return &heapMemory{} }
