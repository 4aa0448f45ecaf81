//go:build unix

package diskuse

import (
	"io/fs"
	"syscall"
)

func allocatedBytes(info fs.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return info.Size()
}
