//go:build wasip1

package sdk

import (
	"runtime"
	"unsafe"

	"github.com/engramkv/engram/wasm/abi"
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
	calls   uint64
)

// yieldEvery is how many calls pass between two yields to the Go scheduler.
// Nothing but the call's own goroutine runs during a call unless it blocks,
// and that includes the garbage collector's background mark worker: a
// collection started by an allocation then only advances through the
// allocations' assists, and its write barriers stay on for many calls.
// Yielding every 64 calls lets the worker finish the cycle (it paces itself
// to a fraction of the time since the cycle began) at a small cost per call
// (DESIGN.md, "Per-call costs in the host and the SDK"). It also lets
// goroutines a driver started run more often.
const yieldEvery = 64

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
	calls++
	switch {
	case abi.Op(op) == abi.OpIdle:
		// Let goroutines that drivers started run, and collect garbage
		// while nobody waits: between calls nothing in the instance runs.
		runtime.Gosched()
		runtime.GC()
	case calls%yieldEvery == 0:
		runtime.Gosched()
	}
	return pack(resp)
}

func pack(resp []byte) uint64 {
	if len(resp) == 0 {
		return 0
	}
	return abi.PackResult(uint32(uintptr(unsafe.Pointer(unsafe.SliceData(resp)))), uint32(len(resp)))
}
