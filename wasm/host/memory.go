package host

// heapMemory is linear memory in a Go slice, grown by append: what wazero
// does without an allocator, for hosts where mmapAllocator is unavailable.
type heapMemory struct{ buf []byte }

func (m *heapMemory) Reallocate(size uint64) []byte {
	if size > uint64(cap(m.buf)) {
		m.buf = append(m.buf[:cap(m.buf)], make([]byte, size-uint64(cap(m.buf)))...)
	}
	m.buf = m.buf[:size]
	return m.buf
}

func (m *heapMemory) Free() { m.buf = nil }
