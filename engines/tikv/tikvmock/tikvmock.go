// Package tikvmock runs the TiKV adaptor over client-go's in-process mock
// TiKV cluster (github.com/tikv/client-go/v2/testutils): PD, regions and
// TiKV's transactional MVCC in memory, no processes or ports. It exists for
// tests: the adaptor's conformance and fault tests, test servers that want
// the TiKV code path (the Kubernetes storage suite), and several Engram
// nodes sharing one cluster.
//
// It owns building the mock cluster (optionally split into several
// regions, so that Partitions and cross-region scans and commits are
// exercised; optionally churning, its regions split, merged and their
// leaders moved under the client's requests: churn.go, with PD's view of
// each change lagging behind it: pdlag.go), the region statistics the
// adaptor's Size reads (regionstats.go), and handing it to tikv.New, or
// (Cluster.Mock) to tikvserve, which serves it over gRPC to clients in
// other processes. It must not be used by production
// code: nothing is durable and the mock is not TiKV's real storage engine.
package tikvmock

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/tikv/client-go/v2/testutils"
	tikvclient "github.com/tikv/client-go/v2/tikv"
	pd "github.com/tikv/pd/client"

	"github.com/engramkv/engram/engines/tikv"
)

// DefaultPrefix is the key prefix used when Options.Store.Prefix is empty
// (the adaptor requires one).
const DefaultPrefix = "engram/"

// DefaultSplits are user keys at which Open splits the keyspace when
// Options.Splits is nil: ten regions, with boundaries inside the key ranges
// the conformance suite and Engram's own key layout use, so that scans,
// conditional commits and partitions routinely cross regions.
var DefaultSplits = []string{"b", "cw/08", "g", "p/0500", "p/1000", "p/1500", "snap/00800", "t", "\x80"}

// Options configures Open.
type Options struct {
	// Store configures the adaptor; its connection fields are ignored,
	// an empty Prefix means DefaultPrefix and a nil RegionStats the
	// cluster's own (Cluster.RegionStats).
	Store tikv.Options
	// Splits are user keys (Store.Prefix is prepended) at which the mock
	// keyspace is split into regions. Nil means DefaultSplits; an empty
	// non-nil slice keeps one region.
	Splits []string
	// Hijack, when set, wraps the RPC client between client-go and the
	// mock TiKV, so a test can delay, fail or drop chosen requests.
	Hijack func(tikvclient.Client) tikvclient.Client
	// Churn, when Churn.Every is positive, gives every region three peers
	// on three stores and changes the cluster under the client's requests
	// (churn.go), optionally with PD lagging behind the changes
	// (pdlag.go). The adaptor then meets EpochNotMatch, region-miss and
	// NotLeader answers, and stale answers from PD.
	Churn ChurnOptions
}

// Open starts a fresh, empty mock cluster and returns the adaptor on it.
// Closing the store releases the mock.
func Open(opts Options) (*tikv.Store, error) {
	if len(opts.Store.Prefix) == 0 {
		opts.Store.Prefix = []byte(DefaultPrefix)
	}
	splits := opts.Splits
	if splits == nil {
		splits = DefaultSplits
	}
	c, err := NewCluster(SplitKeys(opts.Store.Prefix, splits)...)
	if err != nil {
		return nil, err
	}
	hijack := opts.Hijack
	if opts.Churn.Every > 0 {
		churn, err := c.Churn(opts.Store.Prefix, opts.Churn)
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		hijack = chain(hijack, churn)
	}
	// The only store owns the mock: closing it closes the mock's MVCC
	// store directly.
	return c.open(c.client, opts.Store, hijack)
}

// SplitKeys returns the TiKV keys of user keys splits in namespace prefix,
// for NewCluster.
func SplitKeys(prefix []byte, splits []string) [][]byte {
	keys := make([][]byte, len(splits))
	for i, k := range splits {
		keys[i] = append(bytes.Clone(prefix), k...)
	}
	return keys
}

// Cluster is one mock TiKV cluster that several stores (Engram nodes) can
// share, each with its own client-go client, as separate processes would.
type Cluster struct {
	client  *testutils.MockClient
	pd      pd.Client
	cluster testutils.Cluster

	churnOnce sync.Once
	churn     *churn
	churnErr  error

	replicaOnce sync.Once
	replicaErr  error

	mu     sync.Mutex
	closed bool
}

// NewCluster starts an empty mock cluster whose keyspace is split into
// regions at splits (TiKV keys, prefix included).
func NewCluster(splits ...[]byte) (*Cluster, error) {
	client, cluster, pdClient, err := testutils.NewMockTiKV("", nil)
	if err != nil {
		return nil, fmt.Errorf("tikvmock: start mock TiKV: %w", err)
	}
	keys := slices.Clone(splits)
	// Each split cuts the region created by the previous one, so they
	// must come in key order.
	slices.SortFunc(keys, bytes.Compare)
	keys = slices.CompactFunc(keys, bytes.Equal)
	if len(keys) > 0 && len(keys[0]) == 0 {
		keys = keys[1:] // the keyspace already starts there
	}
	testutils.BootstrapWithMultiRegions(cluster, keys...)
	return &Cluster{client: client, pd: pdClient, cluster: cluster}, nil
}

// Mock is client-go's mock cluster behind c, for a test server that serves
// it over the network (tikvserve): the RPC client that runs requests on
// its MVCC store, the region and store metadata, and the mock PD client.
type Mock struct {
	Client  *testutils.MockClient
	Cluster *testutils.MockCluster
	PD      pd.Client
}

// Mock returns the mock cluster behind c.
func (c *Cluster) Mock() (Mock, error) {
	m, ok := c.cluster.(*testutils.MockCluster)
	if !ok {
		return Mock{}, fmt.Errorf("tikvmock: the mock cluster is a %T, not client-go's mock", c.cluster)
	}
	return Mock{Client: c.client, Cluster: m, PD: c.pd}, nil
}

// Open returns a new store on the shared cluster. Closing it leaves the
// cluster and the other stores running. opts.Prefix must be set; a nil
// opts.RegionStats is the cluster's; hijack may be nil.
func (c *Cluster) Open(opts tikv.Options, hijack func(tikvclient.Client) tikvclient.Client) (*tikv.Store, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("tikvmock: cluster closed")
	}
	return c.open(shared{c.client}, opts, hijack)
}

// Close releases the mock cluster. Stores still open on it fail from then
// on.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return c.client.Close()
}

func (c *Cluster) open(client tikvclient.Client, opts tikv.Options, hijack func(tikvclient.Client) tikvclient.Client) (*tikv.Store, error) {
	var pdc pd.Client = c.pd
	if c.churn != nil && c.churn.pd != nil {
		pdc = &laggingPD{Client: c.pd, lag: c.churn.pd}
	}
	kvs, err := tikvclient.NewTestTiKVStore(client, pdc, hijack, nil, 0)
	if err != nil {
		return nil, fmt.Errorf("tikvmock: client store: %w", err)
	}
	if opts.RegionStats == nil {
		opts.RegionStats = c // Size from the mock's storage
	}
	s, err := tikv.New(kvs, opts)
	if err != nil {
		_ = kvs.Close()
		return nil, err
	}
	return s, nil
}

// shared is the mock RPC client as seen by one of several stores: closing
// a store must not close the MVCC store the others use.
type shared struct{ *testutils.MockClient }

func (shared) Close() error { return nil }
