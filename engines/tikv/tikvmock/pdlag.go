package tikvmock

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"

	"github.com/golang/protobuf/proto" //nolint:staticcheck // kvproto's messages are golang/protobuf v1 messages
	"github.com/pingcap/kvproto/pkg/metapb"
	pd "github.com/tikv/pd/client"
)

// PD learns of a split, a merge or a leader move from the region's
// heartbeat, a moment after TiKV made it; until then it answers lookups
// with the region as it was. pdLag plays that delay: after each churn
// change, the regions it touched keep their old shape (range, epoch,
// leader) in PD's answers for the next ChurnOptions.PDLag requests the
// clients send to TiKV. A client that trusts such an answer meets
// EpochNotMatch, NotLeader or region-miss from TiKV and, for a merged
// region, asks PD again and gets the stale answer again, until the lag
// ends: the loop client-go's backoff exists for.
//
// The lag is counted in requests, not time, like the churn itself, so a
// test's load decides how much of it the client meets: requests to TiKV
// and lookups in PD both count, since a client that keeps asking PD sends
// nothing to TiKV until PD's answer changes, and a lag counted in TiKV
// requests alone would then never end. It covers lookups
// by key and by region id; ScanRegions (batch loading of many regions)
// answers from the current layout, since a stale range mixed into a scan
// of fresh ones would overlap them, which PD's region tree never does.
type pdLag struct {
	ch    *churn
	lag   uint64        // ChurnOptions.PDLag
	clock atomic.Uint64 // requests to TiKV and lookups in PD so far

	mu    sync.Mutex
	stale []staleRegion // in the order recorded; lookups prefer the newest
}

// staleRegion is a region as PD still reports it, until the lag's clock
// passes until.
type staleRegion struct {
	meta   *metapb.Region
	leader *metapb.Peer
	until  uint64
}

// tick counts one request to TiKV or one lookup in PD.
func (l *pdLag) tick() uint64 { return l.clock.Add(1) }

// record keeps r (with its leader) as PD's answer for the next l.lag
// requests. It is called with the region as it was just before a change.
func (l *pdLag) record(r *metapb.Region, leader *metapb.Peer) {
	now := l.clock.Load()
	l.mu.Lock()
	defer l.mu.Unlock()
	live := l.stale[:0]
	for _, s := range l.stale {
		if s.until > now {
			live = append(live, s)
		}
	}
	l.stale = append(live, staleRegion{
		meta:   proto.Clone(r).(*metapb.Region),
		leader: proto.Clone(leader).(*metapb.Peer),
		until:  now + l.lag,
	})
}

// find returns the newest stale region that match accepts, if any is
// still lagging.
func (l *pdLag) find(match func(*metapb.Region) bool) *pd.Region {
	now := l.tick()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.stale) - 1; i >= 0; i-- {
		s := l.stale[i]
		if s.until > now && match(s.meta) {
			l.ch.stats.StaleRegionAnswers.Add(1)
			return &pd.Region{Meta: proto.Clone(s.meta).(*metapb.Region), Leader: proto.Clone(s.leader).(*metapb.Peer)}
		}
	}
	return nil
}

// laggingPD answers region lookups through a pdLag, and everything else
// from the mock's PD.
type laggingPD struct {
	pd.Client
	lag *pdLag
}

func contains(r *metapb.Region, key []byte) bool {
	return bytes.Compare(r.GetStartKey(), key) <= 0 && (len(r.GetEndKey()) == 0 || bytes.Compare(key, r.GetEndKey()) < 0)
}

func (p *laggingPD) GetRegion(ctx context.Context, key []byte, opts ...pd.GetRegionOption) (*pd.Region, error) {
	if r := p.lag.find(func(r *metapb.Region) bool { return contains(r, key) }); r != nil {
		return r, nil
	}
	return p.Client.GetRegion(ctx, key, opts...)
}

func (p *laggingPD) GetPrevRegion(ctx context.Context, key []byte, opts ...pd.GetRegionOption) (*pd.Region, error) {
	// The region before key is the one that ends at key.
	if r := p.lag.find(func(r *metapb.Region) bool { return len(key) > 0 && bytes.Equal(r.GetEndKey(), key) }); r != nil {
		return r, nil
	}
	return p.Client.GetPrevRegion(ctx, key, opts...)
}

func (p *laggingPD) GetRegionByID(ctx context.Context, id uint64, opts ...pd.GetRegionOption) (*pd.Region, error) {
	if r := p.lag.find(func(r *metapb.Region) bool { return r.GetId() == id }); r != nil {
		return r, nil
	}
	return p.Client.GetRegionByID(ctx, id, opts...)
}
