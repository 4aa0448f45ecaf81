package host

import (
	"testing"
	"unsafe"
)

// TestLinearMemoryAllocator: memory grows in place up to its maximum,
// new pages read as zero, and growing past the maximum fails.
func TestLinearMemoryAllocator(t *testing.T) {
	const page = 64 << 10
	m := mmapAllocator{}.Allocate(page, 8*page)
	defer m.Free()
	b := m.Reallocate(page)
	if len(b) != page {
		t.Fatalf("len %d", len(b))
	}
	b[page-1] = 7
	g := m.Reallocate(4 * page)
	if len(g) != 4*page || g[page-1] != 7 {
		t.Fatalf("grown memory: len %d, old byte %d", len(g), g[page-1])
	}
	if _, ok := m.(*mmapMemory); ok && unsafe.SliceData(g) != unsafe.SliceData(b) {
		t.Fatal("a mapped memory moved when it grew")
	}
	for i := page; i < len(g); i++ {
		if g[i] != 0 {
			t.Fatalf("byte %d of a new page is %d", i, g[i])
		}
	}
	if _, ok := m.(*mmapMemory); ok && m.Reallocate(9*page) != nil {
		t.Fatal("grew past the maximum")
	}
}
