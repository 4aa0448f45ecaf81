package mvcc

import (
	"context"

	"github.com/engramkv/engram/core/kv"
)

// CommitMeta commits writes to the store's own records (coder.MetaKey:
// the alarms, for one) through the writer, with the leader's fence, taking
// no revision. The ops must be idempotent: as with compaction's writes, an
// uncertain outcome is reported, not resolved, and the caller may repeat.
func (b *Backend) CommitMeta(ctx context.Context, ops []kv.Op) error {
	return b.commitCompaction(ctx, ops)
}
