//go:build !wasip1

package sdk

import (
	"os"
	"time"
	"unsafe"

	"github.com/engramkv/engram/wasm/abi"
)

// Outside wasm (the SDK's own unit tests, editors, go vet) the host imports
// are stand-ins: logs go to stderr, the clock is the process's, and every
// socket operation is denied, as an ungranted host would answer.

func hostLog(level int32, ptr unsafe.Pointer, n uint32) {
	os.Stderr.Write(unsafe.Slice((*byte)(ptr), n))
	os.Stderr.WriteString("\n")
}

func hostClockNow(clock int32) int64 { return time.Now().UnixNano() }

func hostNetDial(ptr unsafe.Pointer, n uint32, timeoutMs int32) int32 { return abi.ErrnoDenied }

func hostNetRead(h int32, ptr unsafe.Pointer, n uint32) int32 { return abi.ErrnoClosed }

func hostNetWrite(h int32, ptr unsafe.Pointer, n uint32) int32 { return abi.ErrnoClosed }

func hostNetClose(h int32) int32 { return abi.ErrnoClosed }

func hostNetSetDeadline(h int32, which int32, unixNano int64) int32 { return abi.ErrnoClosed }
