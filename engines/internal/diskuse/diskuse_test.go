package diskuse

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// TestAllocatedCountsBlocks: a sparse file counts only the blocks written,
// and files in subdirectories count too.
func TestAllocatedCountsBlocks(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "data"), make([]byte, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	sparse, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sparse.Truncate(256 << 20); err != nil {
		t.Fatal(err)
	}
	sparse.Close()
	n, err := Allocated(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n < 64<<10 {
		t.Errorf("Allocated = %d, less than the 64 KiB written", n)
	}
	if runtime.GOOS == "linux" && n >= 256<<20 {
		t.Errorf("Allocated = %d: the sparse file's length was counted, not its blocks", n)
	}
}

func TestAllocatedMissingDir(t *testing.T) {
	if _, err := Allocated(filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Error("Allocated of a missing directory succeeded")
	}
}
