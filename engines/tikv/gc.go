package tikv

import (
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/tikv/client-go/v2/oracle"
)

// gcServiceIDPrefix names the PD service safe point a Store registers; the
// rest of the ID is the hex of its key prefix, so Engram clusters sharing
// one TiKV hold separate safe points.
const gcServiceIDPrefix = "engram-"

// GC runs one MVCC garbage collection of the TiKV cluster, keeping
// lifeTime worth of history, and returns the safe point it set.
//
// A TiKV cluster without TiDB has no GC worker: nothing removes old
// versions unless a client advances the cluster's GC safe point (TiKV then
// compacts them away). The safe point is cluster-wide, so GC cooperates
// with the cluster's other users: it registers its own wish as a PD
// "service safe point" (PD reports the lowest one, which covers TiDB's GC
// worker, BR, TiCDC and other Engram clusters) and never advances the
// cluster's safe point past that minimum. Before advancing it, client-go
// resolves every lock older than the safe point, cluster-wide.
func (s *Store) GC(ctx context.Context, lifeTime time.Duration) (uint64, error) {
	if err := s.gate.Enter(); err != nil {
		return 0, err
	}
	defer s.gate.Exit()
	return s.gcOnce(ctx, lifeTime)
}

func (s *Store) gcServiceID() string {
	return gcServiceIDPrefix + hex.EncodeToString(s.prefix)
}

// runGC is one round of the periodic GC. Stopping it cancels ctx: Close
// must not wait for a cluster-wide lock scan to finish.
func (s *Store) runGC(ctx context.Context, lifeTime time.Duration) {
	start := time.Now()
	sp, err := s.gcOnce(ctx, lifeTime)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("TiKV GC failed", "err", err)
		}
		return
	}
	s.log.Debug("TiKV GC done", "safe-point", oracle.GetTimeFromTS(sp), "took", time.Since(start))
}

// gcOnce is GC without the gate: Close stops runGC before it closes the
// client, so the client outlives every run.
func (s *Store) gcOnce(ctx context.Context, lifeTime time.Duration) (uint64, error) {
	now, err := s.timestamp(ctx)
	if err != nil {
		return 0, fmt.Errorf("tikv: gc: %w", err)
	}
	want := oracle.GoTimeToTS(oracle.GetTimeFromTS(now).Add(-lifeTime))
	// The service safe point expires if this process stops renewing it,
	// so a dead Engram does not hold back the cluster's GC forever.
	ttl := int64((3 * lifeTime).Seconds())
	minSP, err := s.kvs.GetPDClient().UpdateServiceGCSafePoint(ctx, s.gcServiceID(), ttl, want)
	if err != nil {
		return 0, fmt.Errorf("tikv: gc: register service safe point: %w", withCtx(ctx, err))
	}
	sp := min(want, minSP)
	got, err := s.kvs.GC(ctx, sp)
	if err != nil {
		return 0, fmt.Errorf("tikv: gc at safe point %d: %w", sp, withCtx(ctx, err))
	}
	return got, nil
}
