package host

import (
	"context"

	"github.com/engramkv/engram/core/kv"
)

// Reclaim is kv.Reclaimer (etcd's Defragment) with nothing to do: the
// plugin ABI has no call asking a guest engine to reclaim space, so a wasm
// engine manages its space by itself, as it does today, and Defragment
// succeeds without work. A reclamation call would be a new ABI operation
// (abi/abi.go), added with a version bump when an engine needs one.
func (s *Store) Reclaim(ctx context.Context) error {
	if s.isClosed() {
		return kv.ErrClosed
	}
	return ctx.Err()
}

var _ kv.Reclaimer = (*Store)(nil)
