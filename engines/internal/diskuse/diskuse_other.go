//go:build !unix

package diskuse

import "io/fs"

func allocatedBytes(info fs.FileInfo) int64 { return info.Size() }
