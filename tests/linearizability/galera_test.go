package linearizability

import (
	"context"
	"testing"
	"time"

	"github.com/engramkv/engram/internal/mysqltest"
	"github.com/engramkv/engram/internal/proctest"
)

// galeraLease is the cluster lease over Galera, as over PostgreSQL.
const galeraLease = 2 * time.Second

// TestClusterGaleraFaults runs three engram processes, each on its own node
// of a three-node MariaDB Galera cluster through mysql.wasm, under the load,
// and in turn: kills the Engram leader (SIGKILL) and restarts it; kills the
// mariadbd under the Engram leader and restarts it (it rejoins by state
// transfer); pauses the mariadbd under a follower (SIGSTOP, a partition
// stand-in) and resumes it; and pauses two of the three mariadbd, which
// takes the quorum from the third: writes are refused until they return,
// with no split brain. This run once recorded a read's revision going
// back by one after a leader's uncertain commit (DESIGN.md, "The read
// barrier").
func TestClusterGaleraFaults(t *testing.T) {
	plugin := proctest.BuiltFile(t, "../../bin/mysql.wasm", "adaptors")
	cluster := mysqltest.StartGalera(t, 3)
	var dbs []wasmNode
	for _, db := range cluster.Nodes {
		dbs = append(dbs, wasmNode{config: "dsn=" + db.DSN("") + " table=engram_lin", addr: db.Addr})
	}
	nodes, eps := startWasmCluster(t, "lin-galera", plugin, galeraLease, dbs)
	must := func(what string, err error) bool {
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return false
		}
		return true
	}
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

			l := f.processLeader(-1)
			if l < 0 || !must("killing mariadbd", cluster.Kill(l)) {
				return
			}
			f.note("kill-db", "SIGKILL the mariadbd under engram leader %d", l)
			next := f.processLeader(l)
			if next < 0 {
				return
			}
			f.note("failover", "node %d leads", next)
			f.readback("failover from a dead database node")
			if !must("restarting mariadbd", cluster.Restart(l)) {
				return
			}
			f.note("restart-db", "mariadbd %d rejoined", l)
			f.readback("database node rejoined")
			pause()

			l = f.processLeader(-1)
			if l < 0 {
				return
			}
			follower := (l + 1) % len(nodes)
			if !must("pausing mariadbd", cluster.Pause(follower)) {
				return
			}
			f.note("pause-db", "SIGSTOP the mariadbd under follower %d", follower)
			pause()
			if !must("resuming mariadbd", cluster.Resume(follower)) || !must("resync", cluster.WaitSynced(follower)) {
				return
			}
			f.note("resume-db", "mariadbd %d resumed and synced", follower)
			f.readback("paused database node back")

			// Quorum: the two nodes other than the leader's go quiet.
			l = f.processLeader(-1)
			if l < 0 {
				return
			}
			a, b := (l+1)%len(nodes), (l+2)%len(nodes)
			if !must("pausing mariadbd", cluster.Pause(a)) || !must("pausing mariadbd", cluster.Pause(b)) {
				return
			}
			f.note("quorum-lost", "SIGSTOP the mariadbd under nodes %d and %d", a, b)
			// Galera's suspect timeout (5 s) passes before the survivor
			// leaves the primary component; stay past it.
			f.wait(f.run, 8*time.Second)
			for _, i := range []int{a, b} {
				if !must("resuming mariadbd", cluster.Resume(i)) {
					return
				}
			}
			for i := range cluster.Nodes {
				if !must("resync", cluster.WaitSynced(i)) {
					return
				}
			}
			f.note("quorum-back", "mariadbd %d and %d resumed; every node synced", a, b)
			if f.processLeader(-1) < 0 {
				return
			}
			f.readback("quorum back")
			f.progress(100)
		},
	})
}
