package tikvmock

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pingcap/kvproto/pkg/metapb"
	tikvclient "github.com/tikv/client-go/v2/tikv"
	"github.com/tikv/client-go/v2/tikvrpc"
	"github.com/tikv/client-go/v2/util/codec"
)

// mockScheduler is what churn needs of client-go's mock cluster beyond its
// exported interface; the mock implements all of it.
type mockScheduler interface {
	AllocID() uint64
	AddStore(storeID uint64, addr string, labels ...*metapb.StoreLabel)
	AddPeer(regionID, storeID, peerID uint64)
	GetRegionByKey(key []byte) (*metapb.Region, *metapb.Peer, *metapb.Buckets)
	Split(regionID, newRegionID uint64, key []byte, peerIDs []uint64, leaderPeerID uint64)
	Merge(regionID1, regionID2 uint64)
	ChangeLeader(regionID, leaderPeerID uint64)
}

// ChurnStats counts what a churn did and what the client met, so a test
// can tell that it exercised what it claims to. Safe for concurrent use;
// several stores may share one.
type ChurnStats struct {
	Splits, Merges, LeaderMoves atomic.Int64
	// NotLeader, EpochNotMatch and RegionNotFound count the region errors
	// of those kinds that answered the client's requests.
	NotLeader, EpochNotMatch, RegionNotFound atomic.Int64
	// StaleRegionAnswers counts PD lookups answered with a region as it
	// was before a change (ChurnOptions.PDLag).
	StaleRegionAnswers atomic.Int64
}

// String says what the churn did and met, for a test's log.
func (s *ChurnStats) String() string {
	return fmt.Sprintf("%d splits, %d merges, %d leader moves; the clients met %d NotLeader, %d EpochNotMatch, %d RegionNotFound and %d stale region answers from PD",
		s.Splits.Load(), s.Merges.Load(), s.LeaderMoves.Load(), s.NotLeader.Load(), s.EpochNotMatch.Load(), s.RegionNotFound.Load(), s.StaleRegionAnswers.Load())
}

// ChurnOptions configures a churn (Options.Churn, Cluster.Churn).
type ChurnOptions struct {
	// Every, when positive, makes every Every-th request the clients send
	// first change the cluster under them: a region split, a merge or a
	// new leader, in turn, as PD's scheduling does to a real cluster.
	// Zero means no churn.
	Every int
	// PDLag, when positive, delays PD's view of each change (pdlag.go):
	// for the next PDLag requests, PD still answers lookups of the
	// changed regions with their old range, epoch and leader, as a real
	// PD does until the region's next heartbeat.
	PDLag int
	// Stats, when set, counts what the churn did and met.
	Stats *ChurnStats
}

// churn changes the cluster under a client's requests: every every-th
// request first splits the region of a random key of the namespace, merges
// it with the next one, or moves its leader to another peer, in turn. It is
// driven by the requests, not by a clock, so a test's load decides how much
// churn it meets.
type churn struct {
	c      mockScheduler
	prefix []byte
	every  uint64
	n      atomic.Uint64
	stats  *ChurnStats
	pd     *pdLag // nil without PDLag

	mu   sync.Mutex // one change at a time: each reads, then changes, regions
	rng  *rand.Rand
	turn int
}

// Churn returns a hijack (for Open or Cluster.Open) that churns the cluster
// under the requests of the clients it wraps, as opts describes: every
// opts.Every-th request of all of them together makes a change around a
// random key of namespace prefix. The first call gives every region peers
// on two more stores (Replicate) and fixes the options and prefix for the
// cluster; stores opened on the cluster after it see PD through the
// churn's lag.
func (c *Cluster) Churn(prefix []byte, opts ChurnOptions) (func(tikvclient.Client) tikvclient.Client, error) {
	if opts.Every <= 0 {
		return nil, fmt.Errorf("tikvmock: churn every %d requests: must be positive", opts.Every)
	}
	c.churnOnce.Do(func() { c.churn, c.churnErr = c.churner(prefix, opts) })
	if c.churnErr != nil {
		return nil, c.churnErr
	}
	return c.churn.wrap, nil
}

// chain applies first, then second (either may be nil).
func chain(first, second func(tikvclient.Client) tikvclient.Client) func(tikvclient.Client) tikvclient.Client {
	return func(inner tikvclient.Client) tikvclient.Client {
		if first != nil {
			inner = first(inner)
		}
		if second != nil {
			inner = second(inner)
		}
		return inner
	}
}

// churner gives every region of c three peers (a region needs several
// peers for its leader to move) and returns the churn for clients of
// namespace prefix.
func (c *Cluster) churner(prefix []byte, opts ChurnOptions) (*churn, error) {
	if err := c.Replicate(); err != nil {
		return nil, err
	}
	stats := opts.Stats
	if stats == nil {
		stats = &ChurnStats{}
	}
	m := c.cluster.(mockScheduler) // Replicate checked it
	ch := &churn{c: m, prefix: bytes.Clone(prefix), every: uint64(opts.Every), stats: stats, rng: rand.New(rand.NewPCG(1, uint64(opts.Every)))}
	if opts.PDLag > 0 {
		ch.pd = &pdLag{ch: ch, lag: uint64(opts.PDLag)}
	}
	return ch, nil
}

// Replicate gives every region of c peers on two more stores, three in
// all, with the leader where it was; regions split off later keep three
// peers. Only the first call changes the cluster; the churn and a test
// server that stops stores (leadership must have somewhere to go) share
// it.
func (c *Cluster) Replicate() error {
	c.replicaOnce.Do(func() { c.replicaErr = c.replicate() })
	return c.replicaErr
}

func (c *Cluster) replicate() error {
	m, ok := c.cluster.(mockScheduler)
	if !ok {
		return fmt.Errorf("tikvmock: the mock cluster %T cannot add stores, split, merge or move leaders", c.cluster)
	}
	stores := []uint64{m.AllocID(), m.AllocID()}
	for _, id := range stores {
		m.AddStore(id, fmt.Sprintf("store%d", id))
	}
	// Walk the regions in key order (region keys are encoded; the first
	// starts at the empty key, the last ends at it).
	var key []byte
	for {
		r, _, _ := m.GetRegionByKey(key)
		if r == nil {
			return fmt.Errorf("tikvmock: no region holds %q", key)
		}
		for _, id := range stores {
			m.AddPeer(r.GetId(), id, m.AllocID())
		}
		if len(r.GetEndKey()) == 0 {
			return nil
		}
		key = r.GetEndKey()
	}
}

// wrap puts the churn in front of a client.
func (ch *churn) wrap(inner tikvclient.Client) tikvclient.Client {
	return &churnClient{Client: inner, ch: ch}
}

type churnClient struct {
	tikvclient.Client
	ch *churn
}

func (c *churnClient) SendRequest(ctx context.Context, addr string, req *tikvrpc.Request, timeout time.Duration) (*tikvrpc.Response, error) {
	if c.ch.pd != nil {
		c.ch.pd.tick()
	}
	if c.ch.n.Add(1)%c.ch.every == 0 {
		c.ch.step()
	}
	resp, err := c.Client.SendRequest(ctx, addr, req, timeout)
	if resp != nil {
		if re, _ := resp.GetRegionError(); re != nil {
			st := c.ch.stats
			switch {
			case re.GetNotLeader() != nil:
				st.NotLeader.Add(1)
			case re.GetEpochNotMatch() != nil:
				st.EpochNotMatch.Add(1)
			case re.GetRegionNotFound() != nil:
				st.RegionNotFound.Add(1)
			}
		}
	}
	return resp, err
}

// step makes one change around a random key of the namespace.
func (ch *churn) step() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	key := append(bytes.Clone(ch.prefix), byte(ch.rng.IntN(256)), byte(ch.rng.IntN(256)))
	enc := codec.EncodeBytes(nil, key)
	r, leader, _ := ch.c.GetRegionByKey(enc)
	if r == nil || leader == nil {
		return
	}
	peers := r.GetPeers()
	at := 0
	for i, p := range peers {
		if p.GetId() == leader.GetId() {
			at = i
		}
	}
	ch.turn++
	// Whatever the change, PD keeps describing the regions it touches as
	// they are now for a while (pdlag.go).
	lagging := func(regions ...*metapb.Region) {
		if ch.pd == nil {
			return
		}
		for _, r := range regions {
			_, l, _ := ch.c.GetRegionByKey(r.GetStartKey())
			ch.pd.record(r, l)
		}
	}
	switch ch.turn % 3 {
	case 0:
		if bytes.Equal(r.GetStartKey(), enc) {
			return
		}
		ids := make([]uint64, len(peers))
		for i := range ids {
			ids[i] = ch.c.AllocID()
		}
		lagging(r)
		ch.c.Split(r.GetId(), ch.c.AllocID(), key, ids, ids[at])
		ch.stats.Splits.Add(1)
	case 1:
		if len(r.GetEndKey()) == 0 {
			return
		}
		next, _, _ := ch.c.GetRegionByKey(r.GetEndKey())
		if next == nil || next.GetId() == r.GetId() {
			return
		}
		lagging(r, next)
		ch.c.Merge(r.GetId(), next.GetId())
		ch.stats.Merges.Add(1)
	case 2:
		lagging(r)
		ch.c.ChangeLeader(r.GetId(), peers[(at+1)%len(peers)].GetId())
		ch.stats.LeaderMoves.Add(1)
	}
}
