package memkv

import (
	"context"

	"github.com/engramkv/engram/core/kv"
)

// Reclaim is kv.Reclaimer (etcd's Defragment) with nothing to do: a
// delete removes the key from the tree at once, and the garbage collector
// frees its memory once no published version of the tree holds it, so
// there is no space for a reclamation to give back.
func (s *Store) Reclaim(ctx context.Context) error {
	if s.closed.Load() {
		return kv.ErrClosed
	}
	return ctx.Err()
}

var _ kv.Reclaimer = (*Store)(nil)
