package host

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/wasm/abi"
)

// Scan implements kv.Store. SCAN_OPEN returns the first batch; a scan with
// more to come stays bound to the instance that opened it (ABI.md, section
// 6), which serves its SCAN_NEXT and SCAN_CLOSE between other calls.
func (s *Store) Scan(ctx context.Context, opts kv.ScanOptions) (kv.Iterator, error) {
	bs := opts.BatchSize
	if bs <= 0 {
		bs = defaultScanBatch
	}
	if m := int(s.manifest.MaxScanBatch); m > 0 && bs > m {
		bs = m
	}
	in, err := s.acquire(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer s.release(in)
	st, body, err := s.call(ctx, in, abi.OpScanOpen, func(b []byte, h abi.Header) []byte {
		return (&abi.ScanOpenRequest{Header: h, Start: opts.Start, End: opts.End, Reverse: opts.Reverse,
			Limit: uint64(max(opts.Limit, 0)), BatchSize: uint32(bs)}).Append(b)
	})
	if err != nil {
		return nil, err
	}
	if st != abi.StatusOK {
		return nil, s.statusErr(in, abi.OpScanOpen, st, body)
	}
	// The copy out of guest memory is made before decoding, so that the
	// pairs alias it.
	id, pairs, more, err := abi.DecodeScanOpened(copyBody(body), in.pairs[:0])
	if err != nil {
		return nil, s.protocolErr(in, abi.OpScanOpen, err)
	}
	in.pairs = pairs
	return &iterator{s: s, in: in, id: id, more: more, pending: toKV(pairs), batch: bs}, nil
}

// copyBody copies a batch's encoded body out of guest memory in one piece:
// one memmove and no zeroing (append, unlike make, does not clear what it
// overwrites), instead of two appends per pair into a zeroed buffer.
func copyBody(body []byte) []byte {
	return append([]byte(nil), body...)
}

// toKV converts decoded pairs, which alias a copied body, to kv.Pairs. The
// decoder caps every slice at its own length, so an append by the caller
// cannot run into its neighbour.
func toKV(pairs []abi.Pair) []kv.Pair {
	if len(pairs) == 0 {
		return nil
	}
	out := make([]kv.Pair, len(pairs))
	for i, p := range pairs {
		out[i] = kv.Pair{Key: p.Key, Value: p.Value}
	}
	clear(pairs) // the scratch must not keep the copy alive
	return out
}

// iterator is a scan open in one instance.
type iterator struct {
	s     *Store
	in    *instance
	id    uint64
	batch int

	mu      sync.Mutex
	more    bool // the plugin still holds the scan
	pending []kv.Pair
	closed  bool
}

// Next implements kv.Iterator.
func (it *iterator) Next(ctx context.Context) ([]kv.Pair, error) {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.s.isClosed() {
		return nil, kv.ErrClosed
	}
	if it.closed {
		return nil, fmt.Errorf("wasm plugin %s: Next on a closed iterator", it.s.manifest.Name)
	}
	if len(it.pending) > 0 {
		b := it.pending
		it.pending = nil
		return b, nil
	}
	for it.more {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		batch, err := it.next(ctx)
		if err != nil {
			it.more = false
			return nil, err
		}
		if len(batch) > 0 {
			return batch, nil
		}
	}
	return nil, nil
}

func (it *iterator) next(ctx context.Context) ([]kv.Pair, error) {
	s := it.s
	in, err := s.acquire(ctx, it.in)
	if err != nil {
		return nil, err
	}
	defer s.release(in)
	st, body, err := s.call(ctx, in, abi.OpScanNext, func(b []byte, h abi.Header) []byte {
		return (&abi.ScanNextRequest{Header: h, ID: it.id, BatchSize: uint32(it.batch)}).Append(b)
	})
	if err != nil {
		return nil, err
	}
	if st != abi.StatusOK {
		return nil, s.statusErr(in, abi.OpScanNext, st, body)
	}
	pairs, more, err := abi.DecodeBatch(copyBody(body), in.pairs[:0])
	if err != nil {
		return nil, s.protocolErr(in, abi.OpScanNext, err)
	}
	in.pairs = pairs
	it.more = more
	return toKV(pairs), nil
}

// Close implements kv.Iterator: it releases the plugin's scan, if the plugin
// still holds it.
func (it *iterator) Close() error {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.closed {
		return nil
	}
	it.closed = true
	it.pending = nil
	if !it.more {
		return nil
	}
	it.more = false
	s := it.s
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	in, err := s.acquire(ctx, it.in)
	if err != nil {
		// A closed store or a discarded instance released the scan.
		return nil
	}
	defer s.release(in)
	st, body, err := s.call(ctx, in, abi.OpScanClose, func(b []byte, h abi.Header) []byte {
		return (&abi.ScanCloseRequest{Header: h, ID: it.id}).Append(b)
	})
	if err != nil {
		return err
	}
	if st != abi.StatusOK {
		return s.statusErr(in, abi.OpScanClose, st, body)
	}
	return nil
}

var _ = time.Second
