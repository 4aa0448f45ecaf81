//go:build wasip1

package sdk

import "unsafe"

// The host imports of ABI major 1 (ABI.md, "Host imports").

//go:wasmimport engram_host_v1 log
func hostLog(level int32, ptr unsafe.Pointer, n uint32)

//go:wasmimport engram_host_v1 clock_now
func hostClockNow(clock int32) int64

//go:wasmimport engram_host_v1 net_dial
func hostNetDial(ptr unsafe.Pointer, n uint32, timeoutMs int32) int32

//go:wasmimport engram_host_v1 net_read
func hostNetRead(h int32, ptr unsafe.Pointer, n uint32) int32

//go:wasmimport engram_host_v1 net_write
func hostNetWrite(h int32, ptr unsafe.Pointer, n uint32) int32

//go:wasmimport engram_host_v1 net_close
func hostNetClose(h int32) int32

//go:wasmimport engram_host_v1 net_set_deadline
func hostNetSetDeadline(h int32, which int32, unixNano int64) int32
