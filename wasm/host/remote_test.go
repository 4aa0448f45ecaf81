package host

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/wasm/abi"
)

// remoteServer is the store behind the faulty plugin: it speaks the ABI's
// encoding over framed TCP (see wasm/testplugins/faulty) on top of a kv.Store,
// so data survives any number of plugin instance crashes.
type remoteServer struct {
	addr  string
	store kv.Store
	ln    net.Listener
	wg    sync.WaitGroup
	// size is SIZE's answer (UNAVAILABLE when negative); reclaims counts
	// RECLAIMs served.
	size     atomic.Int64
	reclaims atomic.Int64
}

func startRemote(t *testing.T, store kv.Store) *remoteServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &remoteServer{addr: ln.Addr().String(), store: store, ln: ln}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				defer c.Close()
				r.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
	})
	return r
}

func (r *remoteServer) serve(c net.Conn) {
	rd := bufio.NewReader(c)
	scans := map[uint64]kv.Iterator{}
	defer func() {
		for _, it := range scans {
			_ = it.Close()
		}
	}()
	var next uint64
	ctx := context.Background()
	for {
		op, err := rd.ReadByte()
		if err != nil {
			return
		}
		n, err := readUvarint(rd)
		if err != nil {
			return
		}
		req := make([]byte, n)
		if _, err := io.ReadFull(rd, req); err != nil {
			return
		}
		if op == 0xF0 { // stall: never answer; wait for the client to go
			_, _ = io.Copy(io.Discard, rd)
			return
		}
		var resp []byte
		fail := func(err error) []byte { return abi.AppendError(nil, abi.StatusInternal, err.Error()) }
		batch := func(it kv.Iterator, id uint64, first bool) []byte {
			pairs, err := it.Next(ctx)
			if err != nil {
				return fail(err)
			}
			ap := make([]abi.Pair, len(pairs))
			for i, p := range pairs {
				ap[i] = abi.Pair{Key: p.Key, Value: p.Value}
			}
			more := len(pairs) > 0
			if !more {
				_ = it.Close()
				delete(scans, id)
			}
			if first {
				return abi.AppendScanOpened(nil, id, ap, more)
			}
			return abi.AppendBatch(abi.AppendStatus(nil, abi.StatusOK), ap, more)
		}
		switch abi.Op(op) {
		case abi.OpGet:
			var m abi.GetRequest
			if err := m.Decode(req); err != nil {
				resp = abi.AppendError(nil, abi.StatusInvalid, err.Error())
				break
			}
			v, err := r.store.Get(ctx, m.Key)
			switch {
			case errors.Is(err, kv.ErrNotFound):
				resp = abi.AppendStatus(nil, abi.StatusNotFound)
			case err != nil:
				resp = fail(err)
			default:
				resp = abi.AppendValue(nil, v)
			}
		case abi.OpScanOpen:
			var m abi.ScanOpenRequest
			if err := m.Decode(req); err != nil {
				resp = abi.AppendError(nil, abi.StatusInvalid, err.Error())
				break
			}
			it, err := r.store.Scan(ctx, kv.ScanOptions{Start: m.Start, End: m.End, Reverse: m.Reverse, Limit: int(m.Limit), BatchSize: int(m.BatchSize)})
			if err != nil {
				resp = fail(err)
				break
			}
			next++
			scans[next] = it
			resp = batch(it, next, true)
		case abi.OpScanNext:
			var m abi.ScanNextRequest
			if err := m.Decode(req); err != nil {
				resp = abi.AppendError(nil, abi.StatusInvalid, err.Error())
				break
			}
			it, ok := scans[m.ID]
			if !ok {
				resp = abi.AppendError(nil, abi.StatusInvalid, "unknown scan")
				break
			}
			resp = batch(it, m.ID, false)
		case abi.OpScanClose:
			var m abi.ScanCloseRequest
			_ = m.Decode(req)
			if it, ok := scans[m.ID]; ok {
				_ = it.Close()
				delete(scans, m.ID)
			}
			resp = abi.AppendOK(nil)
		case abi.OpCommit:
			var m abi.CommitRequest
			if err := m.Decode(req); err != nil {
				resp = abi.AppendError(nil, abi.StatusInvalid, err.Error())
				break
			}
			ops := make([]kv.Op, len(m.Ops))
			for i, o := range m.Ops {
				ops[i] = kv.Op{Kind: kv.OpKind(o.Kind), Key: o.Key, Value: o.Value, Expected: o.Expected}
			}
			err := r.store.Commit(ctx, ops)
			if ce, ok := kv.AsConflict(err); ok {
				resp = abi.AppendConflict(nil, uint32(ce.Index), ce.Exists, ce.Current)
			} else if err != nil {
				resp = abi.AppendError(nil, abi.StatusInvalid, err.Error())
			} else {
				resp = abi.AppendOK(nil)
			}
		case abi.OpSize:
			// A negative size set by a test answers UNAVAILABLE.
			if n := r.size.Load(); n < 0 {
				resp = abi.AppendError(nil, abi.StatusUnavailable, "size unknown for now")
			} else {
				resp = abi.AppendSize(nil, n)
			}
		case abi.OpReclaim:
			r.reclaims.Add(1)
			resp = abi.AppendOK(nil)
		default:
			resp = abi.AppendError(nil, abi.StatusUnsupported, "unsupported op")
		}
		frame := abi.AppendUvarint(nil, uint64(len(resp)))
		if _, err := c.Write(append(frame, resp...)); err != nil {
			return
		}
	}
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
	return 0, errors.New("bad varint")
}
