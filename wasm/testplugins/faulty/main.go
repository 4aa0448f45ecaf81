// Command faulty is a storage plugin that misbehaves on demand, for the
// host's robustness tests. It is a pooled, stateless proxy: every request is
// forwarded in its ABI encoding over a TCP connection (sdk.Dial) to a remote
// server the test runs, which keeps the data, so a test can check that no
// data is lost or corrupted when instances crash and are replaced.
//
// Configuration (the INIT config, space-separated key=value):
//
//	addr=HOST:PORT   the remote server (required; must be an allowed address)
//	mode=MODE        misbehave at INIT: init-error, init-trap
//	space=WORD       misbehave on every SIZE and RECLAIM as WORD says (below);
//	                 their requests are a header alone, with no key to carry
//	                 a word
//
// A request whose bytes contain "faulty:WORD" (in a key, a scan bound, ...)
// makes the instance misbehave as WORD says: panic, trap (a fatal runtime
// error), exit, sleep (sleeps an hour), spin (a busy loop with no host call),
// stall (waits for a reply the server never sends), garbage (an unknown
// status), wronglen (a length prefix longer than the response), empty (a
// zero-length response), huge (a response over the host's limit), leak
// (keeps 8 MiB more memory on every call), and for COMMIT only: uncertain
// (applies it, then answers UNCERTAIN), uncertain-lost (answers UNCERTAIN
// without applying it).
//
// Wire format to the server: request frame = op:u8 len:uvarint body;
// response frame = len:uvarint response. Op 0xF0 asks the server to never
// answer.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/engramkv/engram/wasm/abi"
	"github.com/engramkv/engram/wasm/sdk"
)

func main() { sdk.Serve(&store{}) }

// opStall is the frame op the test server never answers.
const opStall = 0xF0

type store struct {
	addr    string
	maxResp int
	conn    net.Conn
	rd      *bufio.Reader
	frame   []byte
	resp    []byte
	leak    [][]byte
	space   string
}

func (s *store) Init(ctx context.Context, config []byte, host sdk.HostInfo) (sdk.Manifest, error) {
	s.maxResp = host.MaxResponse
	mode := ""
	for _, f := range strings.Fields(string(config)) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "addr":
			s.addr = v
		case "mode":
			mode = v
		case "space":
			s.space = v
		default:
			return sdk.Manifest{}, fmt.Errorf("%w: unknown setting %q", sdk.ErrInvalid, k)
		}
	}
	switch mode {
	case "init-error":
		return sdk.Manifest{}, fmt.Errorf("%w: init-error requested", sdk.ErrInvalid)
	case "init-trap":
		select {}
	}
	if s.addr == "" {
		return sdk.Manifest{}, fmt.Errorf("%w: addr=HOST:PORT is required", sdk.ErrInvalid)
	}
	if err := s.dial(ctx); err != nil {
		return sdk.Manifest{}, fmt.Errorf("%w: %v", sdk.ErrUnavailable, err)
	}
	return sdk.Manifest{Name: "faulty", Version: "1.0.0", Model: sdk.ModelPooled}, nil
}

func (s *store) dial(ctx context.Context) error {
	c, err := sdk.Dial(ctx, "tcp", s.addr)
	if err != nil {
		return err
	}
	s.conn, s.rd = c, bufio.NewReaderSize(c, 64<<10)
	return nil
}

// Dispatch handles every request after INIT in its encoded form.
func (s *store) Dispatch(op abi.Op, req []byte) ([]byte, bool) {
	if op == abi.OpIdle {
		return abi.AppendOK(s.resp[:0]), true
	}
	word := ""
	if i := bytes.Index(req, []byte("faulty:")); i >= 0 {
		w := req[i+len("faulty:"):]
		j := 0
		for j < len(w) && (w[j] == '-' || w[j] >= 'a' && w[j] <= 'z') {
			j++
		}
		word = string(w[:j])
	}
	if op == abi.OpSize || op == abi.OpReclaim {
		word = s.space
	}
	switch word {
	case "panic":
		panic("faulty: panic requested")
	case "trap":
		select {} // fatal error: all goroutines are asleep - deadlock!
	case "exit":
		os.Exit(3)
	case "sleep":
		time.Sleep(time.Hour)
	case "spin":
		for {
		}
	case "garbage":
		return []byte{0xEE, 0x01, 0x02, 0x03}, true
	case "wronglen":
		return append(abi.AppendStatus(nil, abi.StatusOK), 0xE8, 0x07, 's', 'h', 'o', 'r', 't'), true
	case "empty":
		return []byte{}, true
	case "huge":
		return make([]byte, s.maxResp+1), true
	case "leak":
		s.leak = append(s.leak, bytes.Repeat([]byte{1}, 8<<20))
	case "stall":
		return s.forward(opStall, req), true
	case "uncertain":
		if op != abi.OpCommit {
			break
		}
		resp := s.forward(op, req)
		if len(resp) > 0 && resp[0] == byte(abi.StatusOK) {
			return abi.AppendError(s.resp[:0], abi.StatusUncertain, "faulty: applied, but answering UNCERTAIN"), true
		}
		return resp, true
	case "uncertain-lost":
		if op != abi.OpCommit {
			break
		}
		return abi.AppendError(s.resp[:0], abi.StatusUncertain, "faulty: not applied, answering UNCERTAIN"), true
	}
	return s.forward(op, req), true
}

// forward sends one request to the server and returns its response. An I/O
// error desynchronises the stream, so the connection is dropped and the
// next request redials.
func (s *store) forward(op abi.Op, req []byte) []byte {
	sent := false
	fail := func(err error) []byte {
		if s.conn != nil {
			_ = s.conn.Close()
			s.conn = nil
		}
		st := abi.StatusUnavailable
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			st = abi.StatusDeadline
		}
		if sent && op == abi.OpCommit {
			st = abi.StatusUncertain
		}
		return abi.AppendError(s.resp[:0], st, "faulty: "+err.Error())
	}
	if s.conn == nil {
		h, err := abi.DecodeHeader(req)
		if err != nil {
			return abi.AppendError(s.resp[:0], abi.StatusInvalid, err.Error())
		}
		ctx := context.Background()
		if h.Deadline != 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, time.Unix(0, h.Deadline))
			defer cancel()
		}
		if err := s.dial(ctx); err != nil {
			return fail(err)
		}
	}
	s.frame = abi.AppendUvarint(append(s.frame[:0], byte(op)), uint64(len(req)))
	s.frame = append(s.frame, req...)
	if _, err := s.conn.Write(s.frame); err != nil {
		return fail(err)
	}
	sent = true
	n, err := readUvarint(s.rd)
	if err != nil {
		return fail(err)
	}
	if cap(s.resp) < int(n) {
		s.resp = make([]byte, n)
	}
	s.resp = s.resp[:n]
	if _, err := io.ReadFull(s.rd, s.resp); err != nil {
		return fail(err)
	}
	return s.resp
}

func readUvarint(r *bufio.Reader) (uint64, error) {
	var v uint64
	for i := uint(0); i < 10; i++ {
		c, err := r.ReadByte()
		if err != nil {
			return 0, err
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v, nil
		}
	}
	return 0, errors.New("bad frame length")
}

// The typed methods are never reached: Dispatch handles every op. Size and
// Reclaim make the SDK declare SIZE and RECLAIM.

func (s *store) Size(context.Context) (int64, error) { return 0, sdk.ErrUnsupported }
func (s *store) Reclaim(context.Context) error       { return sdk.ErrUnsupported }

func (s *store) Get(context.Context, []byte) ([]byte, error) { return nil, sdk.ErrUnsupported }
func (s *store) Scan(context.Context, sdk.ScanOptions) (sdk.Iterator, error) {
	return nil, sdk.ErrUnsupported
}
func (s *store) Commit(context.Context, []sdk.Op) error { return sdk.ErrUnsupported }

func (s *store) Close(context.Context) error {
	if s.conn != nil {
		return s.conn.Close()
	}
	return nil
}
