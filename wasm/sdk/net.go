package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"
	"unsafe"

	"github.com/engramkv/engram/wasm/abi"
)

// ErrAddressNotAllowed is returned by Dial for an address the operator did
// not list in storage.wasm.allowed-addresses.
var ErrAddressNotAllowed = errors.New("address not allowed by the host (storage.wasm.allowed-addresses)")

// errRefused is the cause of a dial the peer refused or that could not
// reach it.
var errRefused = errors.New("connection refused or unreachable")

// Dial opens a TCP connection through the host, with the signature of
// net.Dialer.DialContext so that it plugs into drivers:
//
//	pgx:      cfg.DialFunc = sdk.Dial (and cfg.LookupFunc returning the host as is)
//	go-redis: redis.Options{Dialer: sdk.Dial}
//	mysql:    mysql.RegisterDialContext("tcp", func(ctx context.Context, addr string) (net.Conn, error) { return sdk.Dial(ctx, "tcp", addr) })
//
// addr must match an allowed address exactly (no DNS happens inside the
// plugin). ctx's deadline bounds the dial; the host also bounds it by the
// request's deadline.
func Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("network %q not supported (tcp only)", network)}
	}
	if err := ctx.Err(); err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	var timeoutMs int32
	if d, ok := ctx.Deadline(); ok {
		ms := time.Until(d).Milliseconds()
		if ms <= 0 {
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.ErrDeadlineExceeded}
		}
		timeoutMs = int32(min(ms, 1<<31-1))
	}
	if addr == "" {
		return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("empty address")}
	}
	h := hostNetDial(unsafe.Pointer(unsafe.StringData(addr)), uint32(len(addr)), timeoutMs)
	raddr := hostAddr(addr)
	if h < 0 {
		return nil, &net.OpError{Op: "dial", Net: network, Addr: raddr, Err: errnoError(h)}
	}
	return &conn{h: h, raddr: raddr}, nil
}

// errnoError maps a net_* error code to the error Go's net package would
// return, so drivers' retry and timeout logic works unchanged.
func errnoError(code int32) error {
	switch code {
	case abi.ErrnoDenied:
		return ErrAddressNotAllowed
	case abi.ErrnoRefused:
		return errRefused
	case abi.ErrnoTimeout:
		return os.ErrDeadlineExceeded
	case abi.ErrnoEOF:
		return io.EOF
	case abi.ErrnoClosed:
		return net.ErrClosed
	}
	return fmt.Errorf("host socket error %s (%d)", abi.ErrnoName(code), code)
}

// hostAddr is a net.Addr for an address string as the plugin gave it.
type hostAddr string

func (a hostAddr) Network() string { return "tcp" }
func (a hostAddr) String() string  { return string(a) }

// conn is a net.Conn over a host socket handle.
type conn struct {
	h      int32
	raddr  hostAddr
	closed bool
}

func (c *conn) Read(p []byte) (int, error) {
	if c.closed {
		return 0, &net.OpError{Op: "read", Net: "tcp", Addr: c.raddr, Err: net.ErrClosed}
	}
	if len(p) == 0 {
		return 0, nil
	}
	n := hostNetRead(c.h, unsafe.Pointer(unsafe.SliceData(p)), uint32(min(len(p), 1<<30)))
	if n < 0 {
		if n == abi.ErrnoEOF {
			return 0, io.EOF
		}
		return 0, &net.OpError{Op: "read", Net: "tcp", Addr: c.raddr, Err: errnoError(n)}
	}
	return int(n), nil
}

func (c *conn) Write(p []byte) (int, error) {
	if c.closed {
		return 0, &net.OpError{Op: "write", Net: "tcp", Addr: c.raddr, Err: net.ErrClosed}
	}
	written := 0
	for written < len(p) {
		chunk := p[written:]
		n := hostNetWrite(c.h, unsafe.Pointer(unsafe.SliceData(chunk)), uint32(min(len(chunk), 1<<30)))
		if n < 0 {
			return written, &net.OpError{Op: "write", Net: "tcp", Addr: c.raddr, Err: errnoError(n)}
		}
		written += int(n)
	}
	return written, nil
}

func (c *conn) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	if rc := hostNetClose(c.h); rc < 0 && rc != abi.ErrnoClosed {
		return &net.OpError{Op: "close", Net: "tcp", Addr: c.raddr, Err: errnoError(rc)}
	}
	return nil
}

func (c *conn) LocalAddr() net.Addr  { return hostAddr("wasm:" + strconv.Itoa(int(c.h))) }
func (c *conn) RemoteAddr() net.Addr { return c.raddr }

func (c *conn) SetDeadline(t time.Time) error      { return c.setDeadline(abi.DeadlineBoth, t) }
func (c *conn) SetReadDeadline(t time.Time) error  { return c.setDeadline(abi.DeadlineRead, t) }
func (c *conn) SetWriteDeadline(t time.Time) error { return c.setDeadline(abi.DeadlineWrite, t) }

func (c *conn) setDeadline(which int32, t time.Time) error {
	if c.closed {
		return net.ErrClosed
	}
	var ns int64
	if !t.IsZero() {
		// A deadline in the past must still mean "expired", never "none".
		ns = max(t.UnixNano(), 1)
	}
	if rc := hostNetSetDeadline(c.h, which, ns); rc < 0 {
		return &net.OpError{Op: "set deadline", Net: "tcp", Addr: c.raddr, Err: errnoError(rc)}
	}
	return nil
}
