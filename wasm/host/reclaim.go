package host

import (
	"context"
	"fmt"
	"time"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/wasm/abi"
)

// Reclaim implements kv.Reclaimer (etcd's Defragment) with the plugin's
// RECLAIM when its manifest declares it. A plugin that does not manages its
// space by itself, and Defragment succeeds without work, as before ABI 1.1.
//
// RECLAIM may rightly run for minutes (a VACUUM, a compaction), so it gets
// the caller's deadline, not the store's call timeout, which only applies
// when the caller set none. It holds one instance of the pool for its run;
// the others keep serving.
func (s *Store) Reclaim(ctx context.Context) error {
	if s.isClosed() {
		return kv.ErrClosed
	}
	if err := ctx.Err(); err != nil || !s.manifest.Supports(abi.OpReclaim) {
		return err
	}
	in, err := s.acquire(ctx, nil)
	if err != nil {
		return err
	}
	defer s.release(in)
	now := time.Now()
	dl, ok := ctx.Deadline()
	if !ok {
		dl = now.Add(s.callTimeout)
	}
	st, body, err := s.callUntil(ctx, in, abi.OpReclaim, now, dl, func(b []byte, h abi.Header) []byte {
		return (&abi.EmptyRequest{Header: h}).Append(b)
	})
	if err != nil {
		return err
	}
	if st != abi.StatusOK {
		return s.statusErr(in, abi.OpReclaim, st, body)
	}
	if err := abi.DecodeEmpty(body); err != nil {
		return s.protocolErr(in, abi.OpReclaim, fmt.Errorf("OK with a body: %w", err))
	}
	return nil
}

var _ kv.Reclaimer = (*Store)(nil)
