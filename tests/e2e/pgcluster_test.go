package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/engramkv/engram/internal/pgtest"
	"github.com/engramkv/engram/internal/proctest"
)

// clusterLease is the leader lease of the cluster tests; a failover should
// take about this long.
const clusterLease = 2 * time.Second

// pgCluster is engram processes in cluster mode sharing one PostgreSQL
// table through postgres.wasm, and a client of every endpoint.
type pgCluster struct {
	t     *testing.T
	nodes []*node
	eps   []string
	cli   *clientv3.Client
	// ids are the nodes' member IDs, as their Status reports them.
	ids []uint64
	// storage are the flags every node gets besides its name.
	storage []string
}

// startPostgresCluster starts n nodes named prefix-0, prefix-1, ... over
// the table, and waits until each answers Status.
func startPostgresCluster(ctx context.Context, t *testing.T, prefix, table string, n int) *pgCluster {
	t.Helper()
	plugin := proctest.BuiltFile(t, "../../bin/postgres.wasm", "adaptors")
	pg := pgtest.Start(t)
	cache, err := pgtest.WasmCacheDir(plugin)
	if err != nil {
		t.Fatal(err)
	}
	c := &pgCluster{t: t, storage: []string{
		"--storage.engine=wasm",
		"--storage.wasm.file=" + plugin,
		"--storage.wasm.config=url=" + pg.URL("") + " table=" + table,
		"--storage.wasm.allowed-addresses=" + pg.Addr,
		"--storage.wasm.cache-dir=" + cache,
		"--cluster.enabled=true",
		fmt.Sprintf("--cluster.lease-duration=%s", clusterLease),
		fmt.Sprintf("--cluster.renew-interval=%s", clusterLease/4),
	}}
	for i := range n {
		nd := c.newNode(fmt.Sprintf("%s-%d", prefix, i), 0)
		c.nodes = append(c.nodes, nd)
		c.eps = append(c.eps, nd.endpoint)
	}
	c.cli, err = clientv3.New(clientv3.Config{Endpoints: c.eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.cli.Close() })
	for _, nd := range c.nodes {
		st, err := c.cli.Status(ctx, nd.endpoint)
		if err != nil {
			t.Fatalf("status of %s: %v", nd.endpoint, err)
		}
		c.ids = append(c.ids, st.Header.MemberId)
	}
	return c
}

// newNode starts a node of the cluster called name, on client port port (0:
// any), without adding it to c.nodes.
func (c *pgCluster) newNode(name string, port int) *node {
	return startNode(c.t, nodeOptions{clientPort: port, args: append([]string{"--name=" + name}, c.storage...)})
}

// leaders returns each node's view of the leader's member ID (0: none, or
// no answer).
func (c *pgCluster) leaders(ctx context.Context) []uint64 {
	out := make([]uint64, len(c.nodes))
	for i, nd := range c.nodes {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := c.cli.Status(sctx, nd.endpoint)
		cancel()
		if err == nil {
			out[i] = st.Leader
		}
	}
	return out
}

// poll asks cond again until it holds or ctx ends. The election runs inside
// the engram processes and their Status is the only view a client has of
// it, so there is no event to wait on.
func (c *pgCluster) poll(ctx context.Context, what string, cond func() bool) {
	c.t.Helper()
	for ctx.Err() == nil {
		if cond() {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	c.t.Fatalf("still %s: %v", what, ctx.Err())
}

// leaderOf waits until a node other than exclude reports itself leader and
// returns it.
func (c *pgCluster) leaderOf(ctx context.Context, exclude int) int {
	c.t.Helper()
	found := -1
	c.poll(ctx, fmt.Sprintf("no leader other than node %d", exclude), func() bool {
		for i, v := range c.leaders(ctx) {
			if i != exclude && v != 0 && v == c.ids[i] {
				found = i
				return true
			}
		}
		return false
	})
	return found
}

// awaitLeader waits until every node in idx names node l as leader.
func (c *pgCluster) awaitLeader(ctx context.Context, l int, idx ...int) {
	c.t.Helper()
	c.poll(ctx, fmt.Sprintf("nodes %v not agreeing that node %d leads", idx, l), func() bool {
		views := c.leaders(ctx)
		for _, i := range idx {
			if views[i] != c.ids[l] {
				return false
			}
		}
		return true
	})
}
