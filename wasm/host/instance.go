package host

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/engramkv/engram/wasm/abi"
)

// initialBuffer is the request buffer asked of a new instance; larger
// requests grow it through kvp_buffer.
const initialBuffer = 64 << 10

// clockBase anchors the host's monotonic readings (abort points).
var clockBase = time.Now()

func monotonic() int64 { return int64(time.Since(clockBase)) }

// errAbort is the panic value host functions raise to unwind a guest that
// ran past its abort point; wazero turns it into an error of the call.
var errAbort = errors.New("call aborted: ran past its deadline")

// callCtx is the context passed into every wasm call of an instance. Host
// functions receive it back from wazero and find their instance through it,
// without a map lookup or an allocation per call.
type callCtx struct {
	context.Context
	in *instance
}

// instance is one instantiated module. Only the goroutine that acquired it
// from the pool calls into it, so its call state needs no locking; what
// other goroutines read (memBytes, dead) is atomic or under the pool lock.
type instance struct {
	p     *Plugin
	s     *Store // nil for the version probe at load
	index int
	log   *slog.Logger

	mod        api.Module
	mem        api.Memory
	fnBuffer   api.Function
	fnDispatch api.Function
	stack      [2]uint64
	bufPtr     uint32
	bufCap     int
	scratch    []byte
	pairs      []abi.Pair // decoding scratch for scan batches

	// cctx is the reused context of trusted calls; cur is the one of the
	// call in progress. Untrusted calls get a fresh callCtx each, because
	// wazero's close-on-done goroutine may still read it after the call.
	cctx      callCtx
	cur       *callCtx
	callerCtx context.Context

	// Call state, set by call for the duration of one wasm call and read
	// by host functions on the same goroutine.
	inCall   bool
	deadline int64 // request deadline, unix ns, for sockets
	abortAt  int64 // monotonic ns past which host functions unwind the guest
	grace    int64
	done     <-chan struct{}
	canceled bool
	aborted  bool
	// untrustedCancel releases the per-call context of Options.Untrusted.
	untrustedCancel context.CancelFunc

	conns  connTable
	stderr *lineLog
	stdout *lineLog
	dead   bool // set by the owner goroutine; read under the pool lock after release
	pinned int  // scans open on this instance (under the pool lock)
	// lastCall is when the last call ended (monotonic ns), for the idle
	// loop; written by the owner, read under the pool lock after release.
	lastCall int64
	memSize  atomic.Int64
}

// newInstance instantiates the module, checks the ABI version and sets up
// the request buffer. s is nil for the load-time probe, which only checks
// the version.
func (p *Plugin) newInstance(ctx context.Context, s *Store, index int) (_ *instance, err error) {
	in := &instance{p: p, s: s, index: index}
	in.cctx = callCtx{Context: ctx, in: in}
	in.log = p.log.With("instance", index)
	in.stderr = newLineLog(in.log, slog.LevelWarn, "plugin stderr")
	in.stdout = newLineLog(in.log, slog.LevelInfo, "plugin stdout")
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStdout(in.stdout).
		WithStderr(in.stderr).
		WithRandSource(rand.Reader).
		WithWalltime(in.walltime, sys.ClockResolution(time.Microsecond)).
		WithNanotime(in.nanotime, sys.ClockResolution(1)).
		WithNanosleep(in.nanosleep).
		WithStartFunctions()
	// The allocator is read from the context of instantiation.
	in.cur = &callCtx{Context: experimental.WithMemoryAllocator(ctx, mmapAllocator{}), in: in}
	in.callerCtx = ctx
	mod, err := p.rt.InstantiateModule(in.cur, p.compiled, cfg)
	if err != nil {
		return nil, fmt.Errorf("wasm plugin %s: instantiate: %w%s", p.name, err, in.stderr.tail())
	}
	in.mod = mod
	defer func() {
		if err != nil {
			in.discard()
		}
	}()
	if init := mod.ExportedFunction(abi.ExportInitialize); init != nil {
		if _, err := init.Call(in.cur); err != nil {
			return nil, fmt.Errorf("wasm plugin %s: _initialize: %w%s", p.name, err, in.stderr.tail())
		}
	}
	in.mem = mod.Memory()
	if in.mem == nil {
		return nil, fmt.Errorf("wasm plugin %s: no memory", p.name)
	}
	ver, err := mod.ExportedFunction(abi.ExportVersion).Call(in.cur)
	if err != nil {
		return nil, fmt.Errorf("wasm plugin %s: %s: %w%s", p.name, abi.ExportVersion, err, in.stderr.tail())
	}
	major := int32(uint32(ver[0]))
	supported := false
	for _, m := range SupportedMajors {
		supported = supported || m == major
	}
	if !supported {
		return nil, fmt.Errorf("wasm plugin %s exports ABI version %d, this host supports %v", p.name, major, SupportedMajors[0])
	}
	in.fnBuffer = mod.ExportedFunction(abi.ExportBuffer)
	in.fnDispatch = mod.ExportedFunction(abi.ExportDispatch)
	if err := in.growBuffer(initialBuffer); err != nil {
		return nil, err
	}
	in.memSize.Store(int64(in.mem.Size()))
	return in, nil
}

// growBuffer asks the guest for a request buffer of at least n bytes.
func (in *instance) growBuffer(n int) error {
	in.stack[0] = uint64(uint32(n))
	if err := in.fnBuffer.CallWithStack(in.cur, in.stack[:]); err != nil {
		return fmt.Errorf("%s(%d): %w", abi.ExportBuffer, n, err)
	}
	ptr := uint32(in.stack[0])
	if ptr == 0 {
		return fmt.Errorf("%s(%d) returned 0: the plugin could not provide a request buffer", abi.ExportBuffer, n)
	}
	if uint64(ptr)+uint64(n) > uint64(in.mem.Size()) {
		return fmt.Errorf("%s(%d) returned pointer %d: buffer ends outside memory (%d bytes)", abi.ExportBuffer, n, ptr, in.mem.Size())
	}
	in.bufPtr, in.bufCap = ptr, n
	return nil
}

// failure is why a wasm call failed; every failure discards the instance.
type failure struct {
	kind      errorKind
	err       error
	delivered bool // the request reached kvp_dispatch
}

// roundTrip sends one request and returns the response's status and body,
// which alias guest memory and stay valid until the next call into this
// instance, and never past its discard (its memory is unmapped then: copy
// or format what is kept before releasing the instance). On a failure the
// instance is marked dead.
//
// now is the caller's reading of the clock at the start of the call: one
// clock read serves the deadline, the abort point and the latency metric,
// because several reads per call were a measurable share of its host-side
// time (DESIGN.md, "Per-call costs in the host and the SDK").
func (in *instance) roundTrip(ctx context.Context, op abi.Op, req []byte, now, dl time.Time) (abi.Status, []byte, *failure) {
	in.begin(ctx, now, dl)
	defer in.end()
	if len(req) > in.bufCap {
		if err := in.growBuffer(max(len(req), 2*in.bufCap)); err != nil {
			return 0, nil, in.fail(err, false)
		}
	}
	if !in.mem.Write(in.bufPtr, req) {
		return 0, nil, in.fail(fmt.Errorf("request buffer at %d (%d bytes) lies outside memory", in.bufPtr, len(req)), false)
	}
	in.stack[0], in.stack[1] = uint64(op), uint64(len(req))
	if err := in.fnDispatch.CallWithStack(in.cur, in.stack[:]); err != nil {
		return 0, nil, in.fail(err, true)
	}
	ptr, n := abi.UnpackResult(in.stack[0])
	if n == 0 {
		return 0, nil, in.protocol(errors.New("empty response (no status byte)"))
	}
	if int(n) > in.s.maxResponse {
		return 0, nil, in.protocol(fmt.Errorf("response of %d bytes exceeds the %d-byte limit", n, in.s.maxResponse))
	}
	resp, ok := in.mem.Read(ptr, n)
	if !ok {
		return 0, nil, in.protocol(fmt.Errorf("response [%d, +%d) lies outside memory (%d bytes)", ptr, n, in.mem.Size()))
	}
	st, body, err := abi.SplitResponse(resp)
	if err != nil {
		return 0, nil, in.protocol(fmt.Errorf("status byte %d: %w", resp[0], err))
	}
	return st, body, nil
}

// begin arms the call state host functions check: the request deadline for
// sockets, and the abort point past which any host call unwinds the guest.
func (in *instance) begin(ctx context.Context, now, dl time.Time) {
	in.deadline = dl.UnixNano()
	in.grace = int64(in.s.abortGrace)
	in.abortAt = int64(now.Sub(clockBase)) + int64(dl.Sub(now)) + in.grace
	in.done = ctx.Done()
	in.canceled, in.aborted = false, false
	in.stderr.reset()
	if in.p.opts.Untrusted {
		// wazero stops the guest when this context ends: at the abort
		// point, whatever the caller's context does (a cancelled
		// caller still gets the grace period to unwind cleanly).
		wctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), dl.Add(in.s.abortGrace))
		in.cur = &callCtx{Context: wctx, in: in}
		in.untrustedCancel = cancel
	} else {
		in.cctx.Context = ctx
		in.cur = &in.cctx
	}
	in.callerCtx = ctx
	in.inCall = true
}

func (in *instance) end() {
	in.inCall = false
	in.done = nil
	if in.untrustedCancel != nil {
		in.untrustedCancel()
		in.untrustedCancel = nil
	}
	in.cctx.Context = context.Background()
	in.callerCtx = context.Background()
	in.memSize.Store(int64(in.mem.Size()))
}

func (in *instance) fail(err error, delivered bool) *failure {
	in.dead = true
	f := &failure{kind: kindTrap, err: err, delivered: delivered}
	var exit *sys.ExitError
	switch {
	case in.aborted:
		f.kind = kindDeadline
		f.err = fmt.Errorf("%w (the guest was unwound at its next host call)", errAbort)
	case in.p.opts.Untrusted && errors.As(err, &exit) && (exit.ExitCode() == sys.ExitCodeDeadlineExceeded || exit.ExitCode() == sys.ExitCodeContextCanceled):
		f.kind = kindDeadline
		f.err = fmt.Errorf("%w (interrupted by the untrusted-plugin runtime)", errAbort)
	}
	// wazero appends the guest's stack trace on further lines: keep the
	// first line for the caller (the log gets the whole error) and add
	// what the guest last wrote to stderr (a Go panic's message).
	if msg := f.err.Error(); strings.Contains(msg, "\n") {
		in.log.Debug("wasm call failed", "err", msg)
		f.err = fmt.Errorf("%s", msg[:strings.IndexByte(msg, '\n')])
	}
	if tail := in.stderr.tail(); tail != "" {
		f.err = fmt.Errorf("%w%s", f.err, tail)
	}
	return f
}

func (in *instance) protocol(err error) *failure {
	in.dead = true
	return &failure{kind: kindProtocol, err: err, delivered: true}
}

// checkAbort is called at the start of every host function and clock hook
// during a call. It unwinds the guest (by panicking through wazero) once the
// call is past its abort point, and notices a cancelled caller: the abort
// point then moves to one grace period from now.
func (in *instance) checkAbort() {
	if !in.inCall {
		return
	}
	now := monotonic()
	if !in.canceled && in.done != nil {
		select {
		case <-in.done:
			in.canceled = true
			in.abortAt = min(in.abortAt, now+in.grace)
		default:
		}
	}
	if now > in.abortAt {
		in.aborted = true
		panic(errAbort)
	}
}

// expired reports whether socket operations of the current call must fail
// with TIMEOUT at once: the request's deadline passed or it was cancelled.
func (in *instance) expired() bool {
	if !in.inCall {
		return false
	}
	return in.canceled || time.Now().UnixNano() >= in.deadline
}

// The WASI clock hooks double as abort points: Go's runtime reads the clock
// constantly (scheduler, timers), and sleeps go through nanosleep.
func (in *instance) walltime() (int64, int32) {
	in.checkAbort()
	now := time.Now()
	return now.Unix(), int32(now.Nanosecond())
}

func (in *instance) nanotime() int64 {
	in.checkAbort()
	return monotonic()
}

func (in *instance) nanosleep(ns int64) {
	in.checkAbort()
	if !in.inCall {
		time.Sleep(time.Duration(ns))
		return
	}
	// Sleep no further than the abort point, and wake for a cancelled
	// caller; then checkAbort decides.
	d := min(time.Duration(ns), time.Duration(in.abortAt-monotonic()+1))
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-in.done:
			t.Stop()
		}
	}
	in.checkAbort()
}

// discard closes the module and its sockets. The instance must not be in a
// call.
func (in *instance) discard() {
	in.dead = true
	in.conns.closeAll()
	if in.mod != nil {
		_ = in.mod.Close(context.Background())
	}
}

// lineLog is a guest stdout/stderr: it logs whole lines and keeps the last
// few for crash reports (a Go panic's message goes to stderr just before the
// trap).
type lineLog struct {
	log   *slog.Logger
	level slog.Level
	msg   string
	mu    sync.Mutex
	part  []byte
	last  []string
}

const keepLines = 6

func newLineLog(log *slog.Logger, level slog.Level, msg string) *lineLog {
	return &lineLog{log: log, level: level, msg: msg}
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.part = append(l.part, p...)
	for {
		i := bytes.IndexByte(l.part, '\n')
		if i < 0 {
			break
		}
		l.emit(string(l.part[:i]))
		l.part = l.part[i+1:]
	}
	if len(l.part) > 4096 {
		l.emit(string(l.part))
		l.part = l.part[:0]
	}
	return len(p), nil
}

func (l *lineLog) emit(line string) {
	if line == "" {
		return
	}
	l.log.Log(context.Background(), l.level, l.msg, "line", line)
	// Keep the lines that say what went wrong (a Go runtime's panic or
	// fatal error), not the goroutine dump that follows them.
	if len(l.last) < keepLines && (strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") ||
		strings.HasPrefix(line, "runtime: ") || !strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, "goroutine ") &&
		!strings.Contains(line, "(0x") && !strings.HasPrefix(line, "[")) {
		l.last = append(l.last, line)
	}
}

// reset forgets the kept lines, so a crash report shows only the failing
// call's output.
func (l *lineLog) reset() {
	l.mu.Lock()
	l.last = l.last[:0]
	l.mu.Unlock()
}

// tail returns the last lines written, formatted to append to an error.
func (l *lineLog) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := l.last
	if len(l.part) > 0 {
		lines = append(lines[:len(lines):len(lines)], string(l.part))
	}
	if len(lines) == 0 {
		return ""
	}
	s := "; plugin stderr:"
	for _, ln := range lines {
		s += " | " + ln
	}
	return s
}
