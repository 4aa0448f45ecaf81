//go:build wasip1

package sdk

import (
	"runtime"
	"unsafe"

	"github.com/engramkv/engram/abi"
)

// This file is the module's export surface (ABI.md, "Exports"). The host
// calls these one at a time per instance.

//go:linkname mainMain main.main
func mainMain()

// started guards running main once: a wasip1 reactor's _initialize runs
// package initialisers but not main, and the SDK promises that calling Serve
// from main works.
var (
	started bool
	disp    *dispatcher
	reqBuf  []byte
)

func ensureStarted() {
	if started {
		return
	}
	started = true
	if registered == nil {
		mainMain()
	}
	if registered == nil {
		panic("engram plugin: main did not call sdk.Serve")
	}
	disp = newDispatcher(registered)
}

//go:wasmexport kvp_abi_version
func kvpABIVersion() int32 {
	return abi.Major
}

//go:wasmexport kvp_buffer
func kvpBuffer(minCap int32) uint32 {
	ensureStarted()
	if minCap < 0 {
		return 0
	}
	if cap(reqBuf) < int(minCap) || reqBuf == nil {
		reqBuf = make([]byte, max(int(minCap), 64<<10))
	}
	reqBuf = reqBuf[:cap(reqBuf)]
	return uint32(uintptr(unsafe.Pointer(unsafe.SliceData(reqBuf))))
}

//go:wasmexport kvp_dispatch
func kvpDispatch(op int32, reqLen int32) uint64 {
	ensureStarted()
	if reqLen < 0 || int(reqLen) > len(reqBuf) {
		resp := disp.fail(abi.StatusInvalid, "kvp_dispatch: request length outside the buffer")
		return pack(resp)
	}
	if op < 0 || op > 255 {
		return pack(disp.fail(abi.StatusUnsupported, "kvp_dispatch: op out of range"))
	}
	resp := disp.dispatch(abi.Op(op), reqBuf[:reqLen])
	if abi.Op(op) == abi.OpIdle {
		// Let goroutines that drivers started run, and collect garbage
		// while nobody waits: between calls nothing in the instance runs.
		runtime.Gosched()
		runtime.GC()
	}
	return pack(resp)
}

func pack(resp []byte) uint64 {
	if len(resp) == 0 {
		return 0
	}
	return abi.PackResult(uint32(uintptr(unsafe.Pointer(unsafe.SliceData(resp)))), uint32(len(resp)))
}
