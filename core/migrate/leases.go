package migrate

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// fetchLease imports a lease granted at the source after the last sync.
func (m *migration) fetchLease(ctx context.Context, id int64) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	r, err := m.opts.Client.TimeToLive(cctx, clientv3.LeaseID(id))
	if err != nil {
		return fmt.Errorf("migrate: lease %x of the source: %w", id, err)
	}
	if r.TTL == -1 {
		// Revoked or expired since: its keys' deletes follow.
		return nil
	}
	return m.im.Lease(id, max(r.GrantedTTL, 1))
}

// syncLeases makes the target's leases the source's: new ones granted,
// revoked ones dropped.
func (m *migration) syncLeases(ctx context.Context) error {
	m.lastSync = time.Now()
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := m.opts.Client.Leases(cctx)
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
