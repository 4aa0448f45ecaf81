// Package diskuse measures the disk space an embedded engine's files take.
//
// It owns one rule shared by the embedded adaptors: the space a store takes
// is its files' allocated blocks, not their lengths, because engines
// preallocate or map sparse files (badger's memtable and value-log files,
// pebble's write-ahead log) whose length overstates what the disk gives
// them. A quota on disk space and etcd's DbSize must count the blocks. It
// must not know any engine's file layout.
package diskuse

import (
	"errors"
	"io/fs"
	"path/filepath"
)

// Allocated is the disk space taken by every file under dir. A file that
// disappears during the walk (a compaction deleting the tables it merged)
// takes no space and is skipped.
func Allocated(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path != dir {
				return nil
			}
			return err
		}
		if e.IsDir() {
			return nil
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		n += allocatedBytes(info)
		return nil
	})
	return n, err
}
