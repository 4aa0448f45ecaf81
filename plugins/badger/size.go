package badger

import (
	"io/fs"
	"path/filepath"
)

// diskSize is the disk space the engine's files take. Badger's own Size is
// fed by its expvar metrics, which Open turns off (they are process-global),
// so it always answers 0; and the memtable and value-log files are
// preallocated sparse files, so their length overstates them. The blocks
// actually allocated are what a quota on disk space must count.
func diskSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		n += allocatedBytes(info)
		return nil
	})
	return n, err
}
