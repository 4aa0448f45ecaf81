package linearizability

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvfault"
	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/engines/tikv"
	"github.com/engramkv/engram/engines/tikv/tikvmock"
	"github.com/engramkv/engram/internal/pgtest"
	"github.com/engramkv/engram/internal/proctest"
)

// TestSingleNodeKill9 runs one engram process on badger and kills it with
// SIGKILL every 2-4 s, restarting it on the same data directory, under the
// load.
func TestSingleNodeKill9(t *testing.T) {
	p := startProc(t, "lin-single")
	runChecked(t, runConfig{
		endpoints: []string{p.endpoint},
		schedule: func(ctx context.Context, f *faults) {
			for f.wait(ctx, f.between(2*time.Second, 4*time.Second)) {
				p.kill()
				f.note("kill", "SIGKILL")
				p.restart()
				f.note("restart", "restarted")
				f.readback("restart")
			}
		},
	})
}

// pgLease is the cluster lease over PostgreSQL the runs are specified
// with.
const pgLease = 2 * time.Second

// TestClusterPostgresLeaderKill9 runs three engram processes over one
// PostgreSQL through postgres.wasm and kills the leader with SIGKILL every
// few seconds, restarting it as a follower, under the load.
func TestClusterPostgresLeaderKill9(t *testing.T) {
	plugin := proctest.BuiltFile(t, "../../bin/postgres.wasm", "adaptors")
	pg := pgtest.Start(t)
	node := wasmNode{config: "url=" + pg.URL("") + " table=engram_lin", addr: pg.Addr}
	nodes, eps := startWasmCluster(t, "lin-pg", plugin, pgLease, []wasmNode{node, node, node})
	runChecked(t, runConfig{
		endpoints: eps,
		schedule: func(ctx context.Context, f *faults) {
			for f.wait(ctx, f.between(2*time.Second, 4*time.Second)) {
				if !f.killProcessLeader(nodes) {
					return
				}
			}
		},
	})
}

// wasmNode is one engram process's storage on a wasm SQL adaptor: the
// plugin's config and the address it dials.
type wasmNode struct{ config, addr string }

// startWasmCluster starts an engram process in cluster mode for each of
// nodes, on plugin, with the given lease, named name-0, name-1, ...; it
// returns the processes and their endpoints.
func startWasmCluster(t *testing.T, name, plugin string, lease time.Duration, nodes []wasmNode) ([]*proc, []string) {
	t.Helper()
	return startProcCluster(t, name, lease, wasmStorage(t, plugin, nodes))
}

// wasmStorage is the storage flags of each of nodes on plugin.
func wasmStorage(t *testing.T, plugin string, nodes []wasmNode) [][]string {
	t.Helper()
	cache, err := proctest.WasmCacheDir(plugin)
	if err != nil {
		t.Fatal(err)
	}
	storage := make([][]string, len(nodes))
	for i, n := range nodes {
		storage[i] = []string{
			"--storage.engine=wasm",
			"--storage.wasm.file=" + plugin,
			"--storage.wasm.config=" + n.config,
			"--storage.wasm.allowed-addresses=" + n.addr,
			"--storage.wasm.cache-dir=" + cache,
		}
	}
	return storage
}

// startProcCluster starts an engram process in cluster mode for each
// entry of storage (that node's storage flags), with the given lease,
// named name-0, name-1, ...; it returns the processes and their endpoints.
func startProcCluster(t *testing.T, name string, lease time.Duration, storage [][]string) ([]*proc, []string) {
	t.Helper()
	return startProcClusterOf(t, engramBinary(t), name, lease, storage)
}

// startProcClusterOf is startProcCluster with another engram binary.
func startProcClusterOf(t *testing.T, bin, name string, lease time.Duration, storage [][]string) ([]*proc, []string) {
	t.Helper()
	procs := make([]*proc, len(storage))
	eps := make([]string, len(storage))
	for i, flags := range storage {
		args := append(slices.Clone(flags),
			"--cluster.enabled=true",
			fmt.Sprintf("--cluster.lease-duration=%s", lease),
			fmt.Sprintf("--cluster.renew-interval=%s", lease/4))
		procs[i] = startProcOf(t, bin, fmt.Sprintf("%s-%d", name, i), args...)
		eps[i] = procs[i].endpoint
	}
	return procs, eps
}

// killProcessLeader kills the process that leads with SIGKILL, waits for
// another to lead, and restarts the killed one as a follower, reading back
// after the failover and after the restart. It reports whether the run
// goes on (false: no leader was found, an error already recorded).
func (f *faults) killProcessLeader(nodes []*proc) bool {
	l := f.processLeader(-1)
	if l < 0 {
		return false
	}
	nodes[l].kill()
	f.note("kill", "SIGKILL leader %d", l)
	next := f.processLeader(l)
	if next < 0 {
		return false
	}
	f.note("failover", "node %d leads", next)
	f.readback("failover")
	nodes[l].restart()
	f.note("restart", "node %d restarted", l)
	f.readback("restart")
	return true
}

// processLeader returns the index of the endpoint that reports itself
// leader (not exclude); -1 (and a test error) when none does within a
// minute, which only guards against a hang: an election takes about a
// lease.
func (f *faults) processLeader(exclude int) int {
	ctx, cancel := context.WithTimeout(f.run, time.Minute)
	defer cancel()
	for ctx.Err() == nil {
		// The nodes hold a linearizable read until a leader serves it (a
		// follower waits for the election rather than failing), so when
		// it returns, the election has ended. Its error is not the
		// test's: the Status round below decides.
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		_, _ = f.cli.Get(rctx, "/processLeader")
		rcancel()
		for i, ep := range f.eps {
			if i == exclude {
				continue
			}
			sctx, scancel := context.WithTimeout(ctx, time.Second)
			st, err := f.cli.Status(sctx, ep)
			scancel()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				return i
			}
		}
	}
	f.t.Errorf("no leader among the nodes (excluding %d): %v", exclude, ctx.Err())
	return -1
}

// memberLease is the in-process cluster's lease.
const memberLease = time.Second

// TestClusterSharedStoreFaults runs three in-process nodes over one shared
// memkv store, each seeing it through its own fault wrapper, and in turn
// kills the leader, partitions the leader from the store, partitions a
// follower, and makes the leader's next commits uncertain (one applied, one
// not), under the load.
func TestClusterSharedStoreFaults(t *testing.T) {
	shared := memkv.New()
	t.Cleanup(func() { _ = shared.Close() })
	sharedStoreRun(t, func(int) kv.Store { return shared })
}

// TestClusterTiKVMockFaults is TestClusterSharedStoreFaults's run over
// client-go's mock TiKV, each node
// with its own client (ENGRAM_LIN_SOAK only).
func TestClusterTiKVMockFaults(t *testing.T) {
	if !soak() {
		t.Skip("soak only (ENGRAM_LIN_SOAK=1, make soak)")
	}
	c, err := tikvmock.NewCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	sharedStoreRun(t, func(i int) kv.Store {
		s, err := c.Open(tikv.Options{Prefix: []byte(tikvmock.DefaultPrefix)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// TestClusterTiKVChurnFaults is TestClusterSharedStoreFaults's run over
// client-go's mock TiKV while
// its regions split, merge and change leaders under the nodes' requests
// (every 50th request of all of them; tikvmock's churn) and PD learns of
// each change 25 requests late, each node with its own client: the
// engine's own failovers under Engram's.
func TestClusterTiKVChurnFaults(t *testing.T) {
	c, err := tikvmock.NewCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	var st tikvmock.ChurnStats
	churn, err := c.Churn([]byte(tikvmock.DefaultPrefix), tikvmock.ChurnOptions{Every: 50, PDLag: 25, Stats: &st})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		t.Logf("churn: %v", &st)
		if st.Splits.Load() == 0 || st.LeaderMoves.Load() == 0 || st.NotLeader.Load() == 0 || st.EpochNotMatch.Load() == 0 || st.StaleRegionAnswers.Load() == 0 {
			t.Error("the run met no region churn")
		}
	}()
	sharedStoreRun(t, func(i int) kv.Store {
		s, err := c.Open(tikv.Options{Prefix: []byte(tikvmock.DefaultPrefix)}, churn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// TestClusterPipelineFaults runs three in-process nodes over one shared
// memkv store with the writer's groups bounded to two requests and four
// groups in the pipeline, and keeps making the leader's commits slow (so
// groups stack up behind the one committing) with, in the middle of each
// such stack, a commit that fails, one uncertain and applied, and one
// uncertain and not applied: the groups evaluated on top of a group that
// did not land must be evaluated again, never acknowledged or watched.
func TestClusterPipelineFaults(t *testing.T) {
	shared := memkv.New()
	t.Cleanup(func() { _ = shared.Close() })
	var (
		mu   sync.Mutex
		regs []*prometheus.Registry // one per server started
	)
	stores, members, eps := startSharedMembers(t, func(int) kv.Store { return shared }, func(o *server.Options) {
		o.WriteGroupRequests, o.PipelineDepth = 2, 4
		reg := prometheus.NewRegistry()
		o.Registerer = reg
		mu.Lock()
		regs = append(regs, reg)
		mu.Unlock()
	})
	// The run must have done what it is for: groups stacked in the
	// pipeline, and requests evaluated again after a group below them
	// failed.
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		depth, requeued := 0.0, 0.0
		for _, reg := range regs {
			d, r := pipelineStats(t, reg)
			depth, requeued = max(depth, d), requeued+r
		}
		t.Logf("deepest pipeline %v groups; %v requests evaluated again after a failed group", depth, requeued)
		if depth < 3 || requeued == 0 {
			t.Errorf("the faults never met a pipeline of several groups (deepest %v, %v requests evaluated again)", depth, requeued)
		}
	}()
	leader := awaitLeader(members)
	failed := errors.New("injected commit failure")
	uncertain := fmt.Errorf("injected timeout: %w", kv.ErrUncertain)
	slow := kvfault.Fault{Delay: 30 * time.Millisecond}
	runChecked(t, runConfig{
		endpoints: eps,
		schedule: func(ctx context.Context, f *faults) {
			for f.wait(ctx, f.between(300*time.Millisecond, 600*time.Millisecond)) {
				l := leader(f, -1)
				if l < 0 {
					return
				}
				stores[l].FailCommits(slow, slow, kvfault.Fault{Err: failed},
					slow, slow, kvfault.Fault{Err: uncertain, Apply: true},
					slow, slow, kvfault.Fault{Err: uncertain})
				f.note("pipeline-faults", "leader %d: slow commits with a failed, an applied uncertain and a lost uncertain one among them", l)
			}
		},
	})
}

// startSharedMembers starts three in-process nodes, each over its own fault
// wrapper of the store open returns for it.
func startSharedMembers(t *testing.T, open func(i int) kv.Store, tune func(*server.Options)) ([]*kvfault.Store, []*member, []string) {
	stores := make([]*kvfault.Store, 3)
	members := make([]*member, 3)
	var eps []string
	for i := range members {
		stores[i] = kvfault.Wrap(open(i))
		members[i] = startMember(t, fmt.Sprintf("lin-node-%d", i), stores[i],
			server.ClusterOptions{LeaseDuration: memberLease, RenewInterval: memberLease / 4}, tune)
		eps = append(eps, members[i].addr)
	}
	return stores, members, eps
}

// awaitLeader returns a function that waits for a member other than
// exclude to lead and returns it, or -1 (and a test error). It wakes on the
// members' role changes; the minute only guards against a hang: an election
// takes about a lease.
func awaitLeader(members []*member) func(f *faults, exclude int) int {
	return func(f *faults, exclude int) int {
		ctx, cancel := context.WithTimeout(f.run, time.Minute)
		defer cancel()
		for {
			// The channels are taken before the roles are read, so that
			// no change falls in between.
			changed := make([]<-chan struct{}, len(members))
			for i, m := range members {
				changed[i] = m.RoleChanged()
			}
			for i, m := range members {
				if i != exclude && m.IsLeader() {
					return i
				}
			}
			if !anyClosed(ctx, changed...) {
				f.t.Errorf("no leader among the nodes (excluding %d): %v", exclude, ctx.Err())
				return -1
			}
		}
	}
}

func sharedStoreRun(t *testing.T, open func(i int) kv.Store) {
	stores, members, eps := startSharedMembers(t, open, nil)
	leader := awaitLeader(members)
	partitioned := errors.New("partitioned from the store")
	uncertain := fmt.Errorf("injected timeout: %w", kv.ErrUncertain)
	runChecked(t, runConfig{
		endpoints: eps,
		schedule: func(ctx context.Context, f *faults) {
			for round := 0; f.wait(ctx, f.between(time.Second, 2*time.Second)); round++ {
				l := leader(f, -1)
				if l < 0 {
					return
				}
				switch round % 4 {
				case 0:
					members[l].Kill()
					f.note("kill", "killed leader %d", l)
					next := leader(f, l)
					if next < 0 {
						return
					}
					f.note("failover", "node %d leads", next)
					f.readback("failover")
					members[l].Restart()
					f.note("restart", "node %d restarted", l)
					f.readback("restart")
				case 1:
					stores[l].Partition(partitioned)
					f.note("partition-leader", "leader %d partitioned from the store", l)
					next := leader(f, l)
					stores[l].Heal()
					if next < 0 {
						return
					}
					f.note("failover", "node %d leads; %d healed", next, l)
					f.readback("partition of the leader")
				case 2:
					fo := (l + 1 + f.rng.Intn(2)) % 3
					stores[fo].Partition(partitioned)
					f.note("partition-follower", "follower %d partitioned from the store", fo)
					f.wait(ctx, f.between(500*time.Millisecond, 1500*time.Millisecond))
					stores[fo].Heal()
					f.note("", "follower %d healed", fo)
					f.readback("partition of a follower")
				case 3:
					stores[l].FailCommits(kvfault.Fault{Err: uncertain, Apply: true}, kvfault.Fault{}, kvfault.Fault{Err: uncertain})
					f.note("uncertain-commits", "leader %d: next commit applied but uncertain, the third not applied and uncertain", l)
				}
			}
		},
	})
}

// pipelineStats reads from a server's registry the deepest pipeline its
// writer handed a group to and how many requests it evaluated again.
func pipelineStats(t *testing.T, reg *prometheus.Registry) (depth, requeued float64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "engram_mvcc_pipeline_depth":
				for _, b := range m.GetHistogram().GetBucket() {
					// The first bucket holding every observation bounds
					// the deepest one.
					if b.GetCumulativeCount() == m.GetHistogram().GetSampleCount() {
						if m.GetHistogram().GetSampleCount() > 0 {
							depth = max(depth, b.GetUpperBound())
						}
						break
					}
				}
			case "engram_mvcc_requeued_requests_total":
				requeued += m.GetCounter().GetValue()
			}
		}
	}
	return depth, requeued
}
