package linearizability

import (
	"context"
	"testing"
	"time"

	"github.com/engramkv/engram/engines/tikv/tikvmock"
	"github.com/engramkv/engram/engines/tikv/tikvmock/tikvserve"
)

// tikvLease is the cluster lease over the TiKV fake, as over Galera.
const tikvLease = 2 * time.Second

// TestClusterTiKVProcFaults runs three engram processes with
// storage.engine tikv, each opening TiKV through tikv.Open at the PD
// address of client-go's mock cluster served over gRPC (tikvserve: PD,
// etcd's KV for the safe point, three TiKV stores, ten regions of three
// peers), under the load, and in turn: kills the Engram leader (SIGKILL)
// and restarts it; stops the whole fake (PD and every store, every
// connection dropped) and starts it again on the same ports and data; and
// stops the store that leads the most regions, whose leadership moves to
// the others after the fake's election delay, then starts it again.
func TestClusterTiKVProcFaults(t *testing.T) {
	c, err := tikvmock.NewCluster(tikvmock.SplitKeys([]byte(tikvmock.DefaultPrefix), tikvmock.DefaultSplits)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	srv, err := tikvserve.New(c, tikvserve.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Close()
		if m := srv.Unimplemented(); len(m) > 0 {
			t.Errorf("engram called methods the fake answered Unimplemented: %v", m)
		}
	})
	storage := make([][]string, 3)
	for i := range storage {
		storage[i] = []string{
			"--storage.engine=tikv",
			"--storage.tikv.pd-endpoints=" + srv.PDAddr(),
			"--storage.tikv.prefix=" + tikvmock.DefaultPrefix,
		}
	}
	nodes, eps := startProcCluster(t, "lin-tikv", tikvLease, storage)
	runChecked(t, runConfig{
		endpoints: eps,
		schedule: func(ctx context.Context, f *faults) {
			// Each fault runs to its end (the cluster serving again), so
			// the schedule may outlast the load's duration.
			pause := func() { f.wait(ctx, f.between(time.Second, 2*time.Second)) }

			if !f.killProcessLeader(nodes) {
				return
			}
			pause()

			srv.Stop()
			f.note("tikv-stop", "PD and every TiKV store stopped")
			f.wait(f.run, f.between(time.Second, 2*time.Second))
			if err := srv.Start(); err != nil {
				t.Errorf("starting the fake again: %v", err)
				return
			}
			f.note("tikv-start", "PD and every TiKV store serve again")
			if f.processLeader(-1) < 0 {
				return
			}
			f.readback("the TiKV cluster restarted")
			pause()

			store, led := busiestStore(srv)
			moved, err := srv.StopStore(store)
			if err != nil {
				t.Errorf("stopping store %d: %v", store, err)
				return
			}
			f.note("store-stop", "TiKV store %d, leader of %d regions, stopped", store, led)
			select {
			case <-moved:
			case <-f.run.Done():
				return
			}
			f.note("leaders-moved", "its regions' leaders moved to the other stores: %v", srv.Leaders())
			f.readback("a store stopped")
			pause()
			if err := srv.StartStore(store); err != nil {
				t.Errorf("starting store %d again: %v", store, err)
				return
			}
			f.note("store-start", "TiKV store %d serves again", store)
			f.readback("a store back")
			// The load runs its course after the last fault, so the
			// cluster is seen serving with every store back.
			<-ctx.Done()
		},
	})
}

// busiestStore is the store that leads the most regions, and how many.
func busiestStore(srv *tikvserve.Server) (uint64, int) {
	var id uint64
	most := -1
	leaders := srv.Leaders()
	for _, s := range srv.Stores() {
		if leaders[s] > most {
			id, most = s, leaders[s]
		}
	}
	return id, most
}
