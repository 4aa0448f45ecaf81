package tikv

import (
	"context"

	"github.com/engramkv/engram/core/kv"
)

// Reclaim is kv.Reclaimer (etcd's Defragment) with nothing to do: TiKV
// gives back the space of deleted versions by itself, in its RocksDB
// compactions, once MVCC garbage collection has dropped them, and that GC
// runs on the adaptor's own schedule (gc.go). Defragment deliberately does
// not advance the GC safe point: it is cluster-wide and shared with the
// cluster's other users, and decides how much history readers keep, which
// is not what an operator asks for with `etcdctl defrag`. An operator who
// wants TiKV's files compacted now runs TiKV's own tool (tikv-ctl compact).
func (s *Store) Reclaim(ctx context.Context) error {
	if err := s.gate.Enter(); err != nil {
		return err
	}
	defer s.gate.Exit()
	return ctx.Err()
}

var _ kv.Reclaimer = (*Store)(nil)
