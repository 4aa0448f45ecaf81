package host

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/engramkv/engram/wasm/abi"
)

// maxConns bounds the sockets one instance may hold open.
const maxConns = 64

// hostFunctions are the engram_host_v1 imports (ABI.md, section 3).
var hostFunctions = map[string]struct {
	fn      api.GoModuleFunc
	params  []api.ValueType
	results []api.ValueType
}{
	abi.ImportLog:            {hostLog, []api.ValueType{i32, i32, i32}, nil},
	abi.ImportClockNow:       {hostClockNow, []api.ValueType{i32}, []api.ValueType{i64}},
	abi.ImportNetDial:        {hostNetDial, []api.ValueType{i32, i32, i32}, []api.ValueType{i32}},
	abi.ImportNetRead:        {hostNetRead, []api.ValueType{i32, i32, i32}, []api.ValueType{i32}},
	abi.ImportNetWrite:       {hostNetWrite, []api.ValueType{i32, i32, i32}, []api.ValueType{i32}},
	abi.ImportNetClose:       {hostNetClose, []api.ValueType{i32}, []api.ValueType{i32}},
	abi.ImportNetSetDeadline: {hostNetSetDeadline, []api.ValueType{i32, i32, i64}, []api.ValueType{i32}},
}

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

func instantiateHostModule(ctx context.Context, rt wazero.Runtime) error {
	b := rt.NewHostModuleBuilder(abi.HostModule)
	for name, f := range hostFunctions {
		b.NewFunctionBuilder().WithGoModuleFunction(f.fn, f.params, f.results).Export(name)
	}
	_, err := b.Instantiate(ctx)
	return err
}

// callerOf returns the instance a host function serves. Host functions get
// back the context the host passed into the wasm call, which is always the
// instance's callCtx.
func callerOf(ctx context.Context) *instance {
	if c, ok := ctx.(*callCtx); ok {
		return c.in
	}
	return nil
}

func errno(stack []uint64, code int32) { stack[0] = uint64(uint32(code)) }

func hostLog(ctx context.Context, mod api.Module, stack []uint64) {
	in := callerOf(ctx)
	level, ptr, n := int32(uint32(stack[0])), uint32(stack[1]), uint32(stack[2])
	log := slog.New(slog.DiscardHandler)
	if in != nil {
		in.checkAbort()
		log = in.log
	}
	msg, ok := mod.Memory().Read(ptr, min(n, 64<<10))
	if !ok {
		return
	}
	lv := slog.Level(level)
	switch {
	case lv < slog.LevelInfo:
		lv = slog.LevelDebug
	case lv < slog.LevelWarn:
		lv = slog.LevelInfo
	case lv < slog.LevelError:
		lv = slog.LevelWarn
	default:
		lv = slog.LevelError
	}
	log.Log(ctx, lv, "plugin: "+string(msg))
}

func hostClockNow(ctx context.Context, _ api.Module, stack []uint64) {
	if in := callerOf(ctx); in != nil {
		in.checkAbort()
	}
	switch int32(uint32(stack[0])) {
	case abi.ClockRealtime:
		stack[0] = uint64(time.Now().UnixNano())
	case abi.ClockMonotonic:
		stack[0] = uint64(monotonic())
	default:
		stack[0] = ^uint64(0) // -1
	}
}

func hostNetDial(ctx context.Context, mod api.Module, stack []uint64) {
	in := callerOf(ctx)
	ptr, n, timeoutMs := uint32(stack[0]), uint32(stack[1]), int32(uint32(stack[2]))
	if in == nil || in.s == nil {
		errno(stack, abi.ErrnoDenied)
		return
	}
	in.checkAbort()
	raw, ok := mod.Memory().Read(ptr, n)
	if !ok || n > 1024 {
		errno(stack, abi.ErrnoInvalid)
		return
	}
	addr := string(raw)
	if _, allowed := in.s.allowed[addr]; !allowed {
		in.log.Warn("plugin dialed an address that is not allowed", "addr", addr)
		errno(stack, abi.ErrnoDenied)
		return
	}
	if in.expired() {
		errno(stack, abi.ErrnoTimeout)
		return
	}
	if in.conns.len() >= maxConns {
		errno(stack, abi.ErrnoLimit)
		return
	}
	deadline := time.Unix(0, in.deadline)
	if !in.inCall {
		deadline = time.Now().Add(10 * time.Second)
	}
	if timeoutMs > 0 {
		if d := time.Now().Add(time.Duration(timeoutMs) * time.Millisecond); d.Before(deadline) {
			deadline = d
		}
	}
	dctx, cancel := context.WithDeadline(in.callerCtx, deadline)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		code := ioErrno(err)
		in.log.Debug("plugin dial failed", "addr", addr, "err", err, "code", abi.ErrnoName(code))
		errno(stack, code)
		return
	}
	errno(stack, in.conns.add(c))
}

func hostNetRead(ctx context.Context, mod api.Module, stack []uint64) {
	netIO(ctx, mod, stack, true)
}

// connOf returns the calling instance and its connection h, after the
// abort check every net import makes. With no caller or no such
// connection it returns a nil connection, having answered ErrnoClosed in
// stack; the caller reads its arguments from stack first.
func connOf(ctx context.Context, stack []uint64, h int32) (*instance, *hostConn) {
	in := callerOf(ctx)
	if in == nil {
		errno(stack, abi.ErrnoClosed)
		return nil, nil
	}
	in.checkAbort()
	hc := in.conns.get(h)
	if hc == nil {
		errno(stack, abi.ErrnoClosed)
	}
	return in, hc
}

func hostNetWrite(ctx context.Context, mod api.Module, stack []uint64) {
	netIO(ctx, mod, stack, false)
}

// netIO is net_read and net_write: the request's deadline, the guest's own
// deadline and the caller's cancellation all bound the blocking operation,
// which works directly on a view of guest memory.
func netIO(ctx context.Context, mod api.Module, stack []uint64, read bool) {
	h, ptr, n := int32(uint32(stack[0])), uint32(stack[1]), uint32(stack[2])
	in, hc := connOf(ctx, stack, h)
	if hc == nil {
		return
	}
	if n == 0 {
		stack[0] = 0
		return
	}
	buf, ok := mod.Memory().Read(ptr, n)
	if !ok {
		errno(stack, abi.ErrnoInvalid)
		return
	}
	if in.expired() {
		errno(stack, abi.ErrnoTimeout)
		return
	}
	hc.apply(in, read)
	var stop func() bool
	if in.inCall && in.done != nil {
		// A cancelled caller wakes the blocked operation by moving the
		// socket's deadline into the past.
		stop = context.AfterFunc(in.callerCtx, func() { _ = hc.c.SetDeadline(time.Unix(1, 0)) })
	}
	var got int
	var err error
	if read {
		got, err = hc.c.Read(buf)
	} else {
		got, err = hc.c.Write(buf)
	}
	if stop != nil && !stop() {
		hc.forget() // the deadline was overwritten; reapply next time
	}
	if got > 0 {
		stack[0] = uint64(uint32(got))
		return
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	errno(stack, ioErrno(err))
}

func hostNetClose(ctx context.Context, _ api.Module, stack []uint64) {
	in := callerOf(ctx)
	if in == nil {
		errno(stack, abi.ErrnoClosed)
		return
	}
	in.checkAbort()
	if !in.conns.close(int32(uint32(stack[0]))) {
		errno(stack, abi.ErrnoClosed)
		return
	}
	stack[0] = 0
}

func hostNetSetDeadline(ctx context.Context, _ api.Module, stack []uint64) {
	h, which, ns := int32(uint32(stack[0])), int32(uint32(stack[1])), int64(stack[2])
	_, hc := connOf(ctx, stack, h)
	if hc == nil {
		return
	}
	if ns < 0 {
		errno(stack, abi.ErrnoInvalid)
		return
	}
	switch which {
	case abi.DeadlineBoth:
		hc.guestRead, hc.guestWrite = ns, ns
	case abi.DeadlineRead:
		hc.guestRead = ns
	case abi.DeadlineWrite:
		hc.guestWrite = ns
	default:
		errno(stack, abi.ErrnoInvalid)
		return
	}
	stack[0] = 0
}

// ioErrno maps a Go network error to the ABI's codes.
func ioErrno(err error) int32 {
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF):
		return abi.ErrnoEOF
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return abi.ErrnoTimeout
	case errors.As(err, &ne) && ne.Timeout():
		return abi.ErrnoTimeout
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return abi.ErrnoRefused
	case errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return abi.ErrnoEOF
	}
	return abi.ErrnoIO
}

// hostConn is one guest socket with the deadlines the guest set and the one
// last applied to the OS socket (so an unchanged deadline costs nothing).
type hostConn struct {
	c                      net.Conn
	guestRead, guestWrite  int64
	appliedRead, appliedWr int64
}

// apply sets the socket deadline for one operation: the earlier of the
// guest's own and the request's.
func (hc *hostConn) apply(in *instance, read bool) {
	guest := hc.guestWrite
	applied := &hc.appliedWr
	if read {
		guest, applied = hc.guestRead, &hc.appliedRead
	}
	eff := guest
	if in.inCall && (eff == 0 || in.deadline < eff) {
		eff = in.deadline
	}
	if eff == *applied {
		return
	}
	*applied = eff
	t := time.Time{}
	if eff != 0 {
		t = time.Unix(0, eff)
	}
	if read {
		_ = hc.c.SetReadDeadline(t)
	} else {
		_ = hc.c.SetWriteDeadline(t)
	}
}

func (hc *hostConn) forget() { hc.appliedRead, hc.appliedWr = -1, -1 }

// connTable holds an instance's sockets by handle.
type connTable struct {
	mu    sync.Mutex
	next  int32
	conns map[int32]*hostConn
}

func (t *connTable) add(c net.Conn) int32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conns == nil {
		t.conns = map[int32]*hostConn{}
	}
	for {
		t.next++
		if t.next < 0 {
			t.next = 1
		}
		if _, taken := t.conns[t.next]; !taken {
			break
		}
	}
	t.conns[t.next] = &hostConn{c: c}
	return t.next
}

func (t *connTable) get(h int32) *hostConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.conns[h]
}

func (t *connTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}

func (t *connTable) close(h int32) bool {
	t.mu.Lock()
	hc, ok := t.conns[h]
	delete(t.conns, h)
	t.mu.Unlock()
	if ok {
		_ = hc.c.Close()
	}
	return ok
}

func (t *connTable) closeAll() {
	t.mu.Lock()
	conns := t.conns
	t.conns = nil
	t.mu.Unlock()
	for _, hc := range conns {
		_ = hc.c.Close()
	}
}
