package migrate

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// fetchLease imports a lease granted at the source after the last sync.
func (m *migration) fetchLease(ctx context.Context, id int64) error {
	if m.ph.NoLeaseAPI {
		return m.leaseAsTTL(id)
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	r, err := m.opts.Client.TimeToLive(cctx, clientv3.LeaseID(id))
	if notSupported(err) {
		m.noLeaseAPI(err)
		return m.leaseAsTTL(id)
	}
	if err != nil {
		return fmt.Errorf("migrate: lease %x of the source: %w", id, err)
	}
	if r.TTL == -1 {
		// Revoked or expired since: its keys' deletes follow.
		return nil
	}
	return m.im.Lease(id, max(r.GrantedTTL, 1))
}

// noLeaseAPI switches to kine's lease convention for a source that serves
// no lease API.
func (m *migration) noLeaseAPI(err error) {
	if !m.ph.NoLeaseAPI {
		m.log.Warn("the source serves no lease API (kine); taking each key's lease ID as its TTL in seconds, kine's convention: on the target such a key expires at most that long after the target starts serving, never sooner than on the source", "err", err)
	}
	m.ph.NoLeaseAPI = true
}

// leaseAsTTL imports lease id with a TTL of id seconds: kine grants a lease
// by answering the TTL asked for as its ID, stores that ID on the keys, and
// deletes a key that long after its last write. A lease ID that cannot be
// a TTL is left out: its keys are imported without one attached.
func (m *migration) leaseAsTTL(id int64) error {
	if id <= 0 {
		m.log.Warn("a key's lease ID is not a TTL; its keys are imported with no lease to expire them", "lease", id)
		return nil
	}
	return m.im.Lease(id, id)
}

// syncLeases makes the target's leases the source's: new ones granted,
// revoked ones dropped. A source without a lease API has nothing to sync:
// its leases are the IDs on its keys, imported as the keys arrive.
func (m *migration) syncLeases(ctx context.Context) error {
	m.lastSync = time.Now()
	if m.ph.NoLeaseAPI {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := m.opts.Client.Leases(cctx)
	if notSupported(err) {
		m.noLeaseAPI(err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("migrate: list the source's leases: %w", err)
	}
	at := map[int64]bool{}
	for _, l := range resp.Leases {
		at[int64(l.ID)] = true
		if !m.im.HasLease(int64(l.ID)) {
			if err := m.fetchLease(ctx, int64(l.ID)); err != nil {
				return err
			}
		}
	}
	for _, id := range m.im.Leases() {
		if !at[id] {
			m.im.DropLease(id)
		}
	}
	return nil
}
