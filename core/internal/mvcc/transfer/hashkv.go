package transfer

import (
	"context"
	"fmt"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/mvcc"
)

// KVHash is the answer of HashKV, with etcd's fields.
type KVHash struct {
	Hash uint32
	// Rev is the revision hashed; CurrentRev the store's revision.
	Rev, CurrentRev int64
	// CompactRev is the compacted revision, -1 when the store was never
	// compacted (etcd reports -1 then, and clients compare it).
	CompactRev int64
}

// HashKV computes etcd's HashKV at rev (0 = the current revision): the
// crc32c etcd computes over its key bucket (see etcdfmt.Hashed), bit for bit,
// so `etcdctl endpoint hashkv` agrees between etcd and Engram holding the
// same history, and between Engram nodes. It reads every version the store
// keeps, in revision order, sorted with bounded memory (spilling to
// Options.TempDir).
func HashKV(ctx context.Context, b *mvcc.Backend, rev int64) (KVHash, error) {
	if rev < 0 {
		// etcd hashes no row above a negative revision and answers
		// with the hash of the bucket name alone; so does Engram.
		cur, compact, err := b.Revisions(ctx)
		if err != nil {
			return KVHash{}, err
		}
		return KVHash{Hash: etcdfmt.NewHasher().Sum(), Rev: rev, CurrentRev: cur, CompactRev: b.EtcdCompactRev(compact)}, nil
	}
	sorter := etcdfmt.NewSorter(b.TempDir(), 0)
	defer sorter.Close()
	live := 0
	info, err := Export(ctx, b, rev, func(e *etcdfmt.Entry) error {
		if e.Latest && !e.Tombstone {
			live++
		}
		return sorter.Add(e)
	})
	if err != nil {
		return KVHash{}, err
	}
	compact := b.EtcdCompactRev(info.CompactRev)
	h := etcdfmt.NewHasher()
	err = sorter.Each(ctx, func(e *etcdfmt.Entry) error {
		if etcdfmt.Hashed(e, compact, info.Rev, e.Latest && !e.Tombstone, live == 0) {
			h.Add(e)
		}
		return nil
	})
	if err != nil {
		return KVHash{}, fmt.Errorf("mvcc: hashkv: %w", err)
	}
	return KVHash{Hash: h.Sum(), Rev: info.Rev, CurrentRev: info.CurrentRev, CompactRev: compact}, nil
}
