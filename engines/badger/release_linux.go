package badger

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// releaseTablePages drops from this process's resident set the pages of
// the table files under dir that it has mapped. Badger writes every table
// through a shared file mapping and keeps it mapped, so a bulk load would
// otherwise keep every table it built resident (a million-object restore:
// about 0.65 GiB on top of the heap, DESIGN.md "Bulk restore"). The
// pages stay in the page cache, dirty ones included: a shared mapping's
// contents are the file's, so a later read faults them back in unchanged.
// Released before badger's msync of a new table reaches them, dirty pages
// are also written back without msync's cleaning of each mapped page
// (releaseInterval).
//
// It must run only while no table under dir can be closed (a bulk load: no
// compaction, no DropAll), so that every range it reads from
// /proc/self/maps is still the table's when it is released.
func releaseTablePages(dir string) error {
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return fmt.Errorf("badger: release table pages: %w", err)
	}
	maps, err := os.Open("/proc/self/maps")
	if err != nil {
		return fmt.Errorf("badger: release table pages: %w", err)
	}
	defer maps.Close()
	prefix := []byte(abs + string(filepath.Separator))
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		// start-end perms offset dev inode path
		f := bytes.Fields(sc.Bytes())
		if len(f) < 6 || !bytes.HasPrefix(f[5], prefix) || !bytes.HasSuffix(f[5], []byte(".sst")) {
			continue
		}
		// Only shared mappings ("rw-s"): released pages of a private
		// one would lose what was written to them.
		if len(f[1]) < 4 || f[1][3] != 's' {
			continue
		}
		start, end, ok := bytes.Cut(f[0], []byte("-"))
		if !ok {
			continue
		}
		lo, err1 := strconv.ParseUint(string(start), 16, 64)
		hi, err2 := strconv.ParseUint(string(end), 16, 64)
		if err1 != nil || err2 != nil || hi <= lo {
			continue
		}
		if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, uintptr(lo), uintptr(hi-lo), syscall.MADV_DONTNEED); e != 0 {
			return fmt.Errorf("badger: release table pages of %s: %w", f[5], e)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("badger: release table pages: %w", err)
	}
	return nil
}
