package mvcc

import (
	"context"
	"fmt"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/kv"
)

// Leases in the store: grants and revokes go through the writer like every
// other write; the lessor (package lease) only keeps the in-memory view and
// is rebuilt from the lease records and the lease index at Open.

// GrantLease durably creates lease id with ttl (already clamped by the
// caller) and returns the current revision.
func (b *Backend) GrantLease(ctx context.Context, id, ttl int64) (int64, error) {
	res, err := b.submit(ctx, &request{kind: reqLeaseGrant, leaseID: id, leaseTTL: ttl})
	return res.rev, err
}

// RevokeLease durably removes lease id and deletes its keys in one revision.
func (b *Backend) RevokeLease(ctx context.Context, id int64) (int64, error) {
	res, err := b.submit(ctx, &request{kind: reqLeaseRevoke, leaseID: id})
	return res.rev, err
}

func (g *group) leaseGrant(id, ttl int64) error {
	if g.b.lessor.Known(id) {
		return ErrLeaseExists
	}
	k := coder.LeaseKey(id)
	g.leaseOp(k, kv.PutIfAbsent(k, encodeLease(ttl)))
	g.witnessKey, g.witnessValue, g.witnessGone = k, encodeLease(ttl), false
	g.after = append(g.after, func() { g.b.lessor.Grant(id, ttl) })
	return nil
}

func (g *group) leaseRevoke(id int64) error {
	if !g.b.lessor.Known(id) {
		return ErrLeaseNotFound
	}
	rev := g.rev + 1
	g.changes = g.changes[:0]
	for _, k := range g.b.lessor.Keys(id) {
		s, err := g.state(k)
		if err != nil {
			return err
		}
		if !s.live() || s.cur.Lease != id {
			continue
		}
		g.stageVersion(k, s, Version{ModRev: rev, Tombstone: true}, nil, newEvent(k, s))
	}
	lk := coder.LeaseKey(id)
	g.leaseOp(lk, kv.Delete(lk))
	g.witnessKey, g.witnessGone = lk, true
	if len(g.changes) > 0 {
		g.rev = rev
		g.appendLog(rev)
	}
	g.after = append(g.after, func() { g.b.lessor.Revoke(id) })
	return nil
}

func (b *Backend) loadLeases(ctx context.Context) error {
	leases, err := b.storedLeases(ctx)
	if err != nil {
		return fmt.Errorf("mvcc: load leases: %w", err)
	}
	for _, l := range leases {
		b.lessor.Grant(l.ID, l.TTL)
	}
	err = kv.ScanEach(ctx, b.store, kv.ScanOptions{Start: coder.Prefix(coder.SpaceLeaseKeys), End: coder.SpaceEnd(coder.SpaceLeaseKeys)}, func(p kv.Pair) error {
		id, key, err := coder.DecodeLeaseIndexKey(p.Key)
		if err != nil {
			return err
		}
		b.lessor.Attach(id, key)
		return nil
	})
	if err != nil {
		return fmt.Errorf("mvcc: load lease attachments: %w", err)
	}
	return nil
}

// storedLeases reads the leases from the store (a follower's lessor is
// empty, so the store is the one source every node agrees on).
func (b *Backend) storedLeases(ctx context.Context) ([]etcdfmt.Lease, error) {
	var out []etcdfmt.Lease
	err := kv.ScanEach(ctx, b.store, kv.ScanOptions{Start: coder.Prefix(coder.SpaceLease), End: coder.SpaceEnd(coder.SpaceLease)}, func(p kv.Pair) error {
		id, err := coder.DecodeLeaseKey(p.Key)
		if err != nil {
			return err
		}
		ttl, err := decodeLease(p.Value)
		if err != nil {
			return err
		}
		out = append(out, etcdfmt.Lease{ID: id, TTL: ttl})
		return nil
	})
	if err != nil {
		return nil, storageErr("scan leases", err)
	}
	return out, nil
}
