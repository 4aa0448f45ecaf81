package badger

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestReleaseTablePages maps a table-named file as badger does (shared,
// written through the mapping) and checks that its pages leave the
// resident set while its contents stay.
func TestReleaseTablePages(t *testing.T) {
	dir := t.TempDir()
	const size = 1 << 20
	path := filepath.Join(dir, "000001.sst")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(data)
	for i := range data {
		data[i] = byte(i % 251)
	}
	if rss := mappedRSS(t, path); rss < size/1024 {
		t.Fatalf("before: %d kB resident, want the whole %d kB", rss, size/1024)
	}
	if err := releaseTablePages(dir); err != nil {
		t.Fatal(err)
	}
	if rss := mappedRSS(t, path); rss != 0 {
		t.Fatalf("after: %d kB of the table still resident", rss)
	}
	for i := range data {
		if data[i] != byte(i%251) {
			t.Fatalf("byte %d is %d after the release, want %d", i, data[i], byte(i%251))
		}
	}

	// A private mapping's written pages exist nowhere else: they stay.
	private, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(private)
	private[0] = 'p'
	if err := releaseTablePages(dir); err != nil {
		t.Fatal(err)
	}
	if private[0] != 'p' {
		t.Fatalf("a private mapping's written byte is %q after the release", private[0])
	}
}

// mappedRSS returns the resident kB of this process's mappings of path.
func mappedRSS(t *testing.T, path string) int {
	t.Helper()
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	total, in := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) > 0 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			in = len(fields) >= 6 && fields[5] == real
			continue
		}
		if in && len(fields) >= 2 && fields[0] == "Rss:" {
			n, err := strconv.Atoi(fields[1])
			if err != nil {
				t.Fatal(err)
			}
			total += n
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return total
}
