//go:build !unix

package badger

import "io/fs"

func allocatedBytes(info fs.FileInfo) int64 { return info.Size() }
