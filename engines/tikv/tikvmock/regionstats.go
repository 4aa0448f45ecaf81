package tikvmock

import (
	"context"
	"errors"
	"fmt"

	"github.com/tikv/client-go/v2/testutils"
	"github.com/tikv/client-go/v2/util/codec"

	"github.com/engramkv/engram/engines/tikv"
)

// rawScanner is the mock MVCC store's view of its own storage: every
// entry (locks and all MVCC versions), keyed by the memcomparable encoding
// of the transactional key followed by the version. client-go's leveldb
// mock implements it.
type rawScanner interface {
	RawScan(cf string, startKey, endKey []byte, limit int) []testutils.MVCCPair
}

// statsPage is how many entries one RawScan copies out of the mock.
const statsPage = 1024

// RegionStats is a tikv.RegionStatsSource computed from the mock: the
// bytes of every key and value the mock's MVCC storage holds for the
// transactional keys in [start, end) (raw keys, as the adaptor passes
// them), every version, lock and deletion marker not yet garbage
// collected included, as TiKV's region sizes count them. Keys is the
// number of those entries.
//
// It is exact and current where PD's figures are per whole region, in
// MiB and a heartbeat late (see tikv.Store.Size), so a test over the mock
// sees a write's effect at once. A test PD HTTP server can serve these
// numbers (converted to MiB) to exercise the production client.
func (c *Cluster) RegionStats(ctx context.Context, start, end []byte) (tikv.RegionStats, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return tikv.RegionStats{}, errors.New("tikvmock: region stats: cluster closed")
	}
	raw, ok := c.client.MvccStore.(rawScanner)
	if !ok {
		return tikv.RegionStats{}, fmt.Errorf("tikvmock: region stats: the mock MVCC store %T cannot be scanned", c.client.MvccStore)
	}
	// An entry of key k is encode(k) or encode(k)+version, and the
	// encoding keeps order and is prefix-free, so the entries of the
	// keys in [start, end) are exactly those in [encode(start),
	// encode(end)).
	from, to := codec.EncodeBytes(nil, start), codec.EncodeBytes(nil, end)
	var st tikv.RegionStats
	for {
		if err := ctx.Err(); err != nil {
			return tikv.RegionStats{}, fmt.Errorf("tikvmock: region stats: %w", err)
		}
		page := raw.RawScan("", from, to, statsPage)
		for _, p := range page {
			if p.Err != nil {
				return tikv.RegionStats{}, fmt.Errorf("tikvmock: region stats: scan the mock: %w", p.Err)
			}
			st.Bytes += int64(len(p.Key) + len(p.Value))
			st.Keys++
		}
		if len(page) < statsPage {
			return st, nil
		}
		from = append(page[len(page)-1].Key, 0) // the next key after the last
	}
}

var _ tikv.RegionStatsSource = (*Cluster)(nil)
