package snapshot

import (
	"syscall"

	bolt "go.etcd.io/bbolt"
)

// releasePages tells the kernel this process no longer needs the first
// size bytes of db's mapping resident. The mapping is read-only and backed
// by the file, so nothing is lost: a later read faults the page back in
// from the page cache. Without it every page read stays in the process's
// resident set (ru_maxrss counts them) until the file is closed: a whole
// snapshot's worth during a restore (DESIGN.md, "Bulk restore").
func releasePages(db *bolt.DB, size int64) {
	if size <= 0 {
		return
	}
	// bbolt maps from the start of the file at a page-aligned address
	// and never remaps a read-only database. The call can only fail on a
	// bad range, and then the pages merely stay resident.
	_, _, _ = syscall.Syscall(syscall.SYS_MADVISE, db.Info().Data, uintptr(size), syscall.MADV_DONTNEED)
}
