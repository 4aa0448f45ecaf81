package tikv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/engramkv/engram/core/kv"
)

// RegionStats is what a RegionStatsSource knows of a key range.
type RegionStats struct {
	// Bytes is the approximate size of the range's data in bytes, MVCC
	// versions and TiKV's own metadata included.
	Bytes int64
	// Keys is the approximate number of stored entries (MVCC versions
	// count one each).
	Keys int64
}

// RegionStatsSource tells the approximate size of a range of TiKV keys.
// start and end are raw TiKV keys (the adaptor's prefix included, not
// memcomparable-encoded); end is exclusive and never empty. In production
// it is PD's HTTP API (pdstats.go); package tikvmock computes it from the
// mock cluster.
type RegionStatsSource interface {
	RegionStats(ctx context.Context, start, end []byte) (RegionStats, error)
}

const (
	// sizeCacheTTL is how long Size reuses a measure. PD's figures move
	// only when TiKV's regions report (heartbeats, tens of seconds
	// apart), so reusing one for a second loses nothing, and it bounds
	// the requests to PD at one a second per Store however often Status
	// is called and metrics are scraped (the quota, the third caller,
	// already measures at most once a second).
	sizeCacheTTL = time.Second
	// sizeFailureTTL is how long a failed measure is reused: an
	// unreachable PD can take Size's whole budget to find out, and
	// Status should not wait that long every second.
	sizeFailureTTL = 10 * time.Second
	// sizeTimeout bounds one measure, all PD endpoints together: Size has
	// no context and its callers (Status, a metrics scrape) must not
	// hang on an unreachable PD.
	sizeTimeout = 5 * time.Second
)

// sizeCache holds the last measure and serialises measuring, so that
// concurrent callers share one request.
type sizeCache struct {
	mu       sync.Mutex
	measured time.Time // zero: never
	bytes    int64
	err      error
	failing  bool // the last measure failed (log only the change)
}

// Size is kv.Sizer: the approximate bytes of the adaptor's namespace (its
// Prefix) as TiKV's region statistics tell them (Options.RegionStats; by
// default PD's, see pdstats.go). It is reported as etcd's DbSize, as
// etcd_mvcc_db_total_size_in_bytes, and held against the quota.
//
// Approximate means what PD's statistics are: the sum of the approximate
// sizes of the regions that overlap the namespace, so a region straddling
// its start or end is counted whole (TiKV splits regions at 96 MiB by
// default, so a small namespace sharing regions with other data reads
// larger than it is); each region's size is in whole MiB, a non-empty one
// at least 1 MiB; the sizes are those of TiKV's latest region heartbeats
// (a minute apart by default), so they lag writes; and they count what
// TiKV stores on one replica: every MVCC version not yet garbage collected
// and compacted. Deleting keys therefore shrinks the size only after TiKV's
// GC (Options.GCInterval) and compaction have run. For the quota the lag
// means that writes can pass it by about what is written between two
// reports.
//
// A measure is reused for a second, a failure for ten seconds (without
// asking PD again meanwhile). One measure takes at most five seconds
// (RequestTimeout if shorter), all PD endpoints together.
func (s *Store) Size() (int64, error) {
	if err := s.gate.Enter(); err != nil {
		return 0, err
	}
	defer s.gate.Exit()
	if s.regionStats == nil {
		return 0, errors.New("tikv: size: no region statistics source (the store was made by New without Options.RegionStats)")
	}
	c := &s.size
	c.mu.Lock()
	defer c.mu.Unlock()
	now := s.now()
	ttl := sizeCacheTTL
	if c.err != nil {
		ttl = sizeFailureTTL
	}
	if !c.measured.IsZero() && now.Sub(c.measured) < ttl && !now.Before(c.measured) {
		return c.bytes, c.err
	}
	timeout := sizeTimeout
	if s.requestTimeout > 0 {
		timeout = min(timeout, s.requestTimeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	st, err := s.regionStats.RegionStats(ctx, s.prefix, s.prefixEnd)
	// From when the answer came: a slow one must not leave the measure
	// already stale.
	c.measured = s.now()
	if err != nil {
		c.err = fmt.Errorf("tikv: size of %q: %w", s.prefix, err)
		if !c.failing {
			s.log.Warn("cannot measure the namespace's size from TiKV's region statistics: Status reports none and the quota holds to the last known size meanwhile", "err", err)
		}
		c.failing = true
		return 0, c.err
	}
	if c.failing {
		s.log.Info("measuring the namespace's size from TiKV's region statistics again")
	}
	c.bytes, c.err, c.failing = st.Bytes, nil, false
	return c.bytes, nil
}

var _ kv.Sizer = (*Store)(nil)
