package workload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/bench/result"
)

// SmallCluster replays the life of a small Kubernetes cluster's objects as
// kube-apiserver writes them, so that a store's memory and disk can be
// measured at the size most clusters are: ClusterNodes nodes with their
// heartbeat leases, ClusterPods pods created, moved through their status
// changes, listed, and a share of them deleted and replaced. It is not part
// of "all": it leaves its objects in place for the caller to measure.
const SmallCluster = "small-cluster"

// The small cluster's object sizes, as kube-apiserver stores them
// (protobuf): a pod with its managed fields, one container and the status
// of a running pod is 2-4 KiB; a node with its conditions, addresses and
// the list of images it holds is 6-12 KiB; a node's heartbeat Lease is a
// few hundred bytes. Values are random bytes (incompressible), a fresh one
// for every write, so a compressing engine gains nothing real objects
// would not give it.
const (
	clusterPodSize   = 3 << 10
	clusterNodeSize  = 8 << 10
	clusterLeaseSize = 300
	// clusterNamespaces spreads the pods, as kube-apiserver's keys are
	// /registry/pods/<namespace>/<name>.
	clusterNamespaces = 50
	// clusterPodUpdates is the status changes of a pod's start: bound to
	// a node, ContainerCreating, Running, Ready.
	clusterPodUpdates = 4
	// clusterNodeUpdates and clusterLeaseRenewals are five minutes of a
	// node's life: the kubelet renews its lease every 10 s and writes its
	// status when it changes (here once a minute, as images and pods come
	// and go) and at least every 5 minutes.
	clusterNodeUpdates   = 5
	clusterLeaseRenewals = 30
	// clusterDeleteShare: one pod in this many is deleted and replaced by
	// a new one (a rollout), which goes through its status changes too.
	clusterDeleteShare = 5
	// clusterLists is how many full paginated lists of the pods and of
	// the nodes are made (reflectors starting, controllers resyncing).
	clusterLists = 10
)

// clusterObject is one object of the small cluster and the revision its
// writer last saw (kube-apiserver knows it from its watch cache).
type clusterObject struct {
	key  string
	size int
	rev  atomic.Int64
}

// smallCluster runs the phases one after the other, each as fast as
// Clients closed-loop clients go: nodes and leases created, pods created,
// status updates (pods, nodes and lease renewals mixed), full lists, then
// the rollout (deletes, replacements and their status updates). One
// operation is one request; a conflicting update is retried with the
// revision its Else branch returned, as GuaranteedUpdate does.
func (r *runner) smallCluster(ctx context.Context) (*result.Result, error) {
	base := r.cfg.Prefix + "registry/"
	nodes := make([]*clusterObject, r.cfg.ClusterNodes)
	leases := make([]*clusterObject, r.cfg.ClusterNodes)
	for i := range nodes {
		nodes[i] = &clusterObject{key: fmt.Sprintf("%sminions/node-%04d", base, i), size: clusterNodeSize}
		leases[i] = &clusterObject{key: fmt.Sprintf("%sleases/kube-node-lease/node-%04d", base, i), size: clusterLeaseSize}
	}
	podName := func(i int) string {
		// A ReplicaSet's pods are named <owner>-<random suffix>.
		return fmt.Sprintf("%spods/ns-%02d/app-%016x", base, i%clusterNamespaces, scramble(uint64(i)))
	}
	pods := make([]*clusterObject, r.cfg.ClusterPods)
	for i := range pods {
		pods[i] = &clusterObject{key: podName(i), size: clusterPodSize}
	}

	rec := newRecorder()
	var writes, reads atomic.Int64
	create := func(o *clusterObject) task {
		return func(ctx context.Context, cli *clientv3.Client) (bool, error) {
			resp, err := r.createTxn(ctx, cli, o.key, []byte(randomValue(o.size)))
			if err != nil {
				return false, err
			}
			if !resp.Succeeded {
				return true, fmt.Errorf("create %s: already exists", o.key)
			}
			o.rev.Store(resp.Header.Revision)
			writes.Add(1)
			return false, nil
		}
	}
	update := func(o *clusterObject) task {
		return func(ctx context.Context, cli *clientv3.Client) (bool, error) {
			failed, err := r.clusterUpdate(ctx, cli, o)
			if err == nil {
				writes.Add(1)
			}
			return failed, err
		}
	}
	remove := func(o *clusterObject) task {
		return func(ctx context.Context, cli *clientv3.Client) (bool, error) {
			resp, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(o.key), "=", o.rev.Load())).
				Then(clientv3.OpDelete(o.key)).
				Else(clientv3.OpGet(o.key)).
				Commit()
			if err != nil {
				return false, err
			}
			if !resp.Succeeded {
				return true, fmt.Errorf("delete %s: changed since revision %d", o.key, o.rev.Load())
			}
			writes.Add(1)
			return false, nil
		}
	}
	list := func(prefix string, want int) task {
		return func(ctx context.Context, cli *clientv3.Client) (bool, error) {
			n, pages, err := r.fullList(ctx, cli, prefix)
			reads.Add(int64(pages))
			if err == nil && n != want {
				err = fmt.Errorf("list %s: %d objects, want %d", prefix, n, want)
			}
			return false, err
		}
	}

	var phases []phase
	var setup []task
	for i := range nodes {
		setup = append(setup, create(nodes[i]), create(leases[i]))
	}
	phases = append(phases, phase{name: "nodes", tasks: setup})
	phases = append(phases, phase{name: "pods", tasks: each(pods, create)})
	// Status: one round per lease renewal; the pods' and the nodes' writes
	// fall in rounds spread evenly over them. Within a round the order is
	// random, as kubelets do not take turns, and no object is written
	// twice, so only a round's boundary can make two writes of one object
	// race.
	var status []task
	const rounds = clusterLeaseRenewals
	due := func(round, n int) bool { return (round+1)*n/rounds != round*n/rounds }
	for round := range rounds {
		t := each(leases, update)
		if due(round, clusterPodUpdates) {
			t = append(t, each(pods, update)...)
		}
		if due(round, clusterNodeUpdates) {
			t = append(t, each(nodes, update)...)
		}
		rand.Shuffle(len(t), func(a, b int) { t[a], t[b] = t[b], t[a] })
		status = append(status, t...)
	}
	phases = append(phases, phase{name: "status", tasks: status})
	var lists []task
	for range clusterLists {
		lists = append(lists, list(base+"pods/", len(pods)), list(base+"minions/", len(nodes)))
	}
	phases = append(phases, phase{name: "lists", tasks: lists, clients: r.cfg.ListClients})
	var gone, replacements []*clusterObject
	for i := 0; i < len(pods); i += clusterDeleteShare {
		gone = append(gone, pods[i])
		replacements = append(replacements, &clusterObject{key: podName(len(pods) + i), size: clusterPodSize})
	}
	phases = append(phases, phase{name: "rollout", tasks: append(each(gone, remove), each(replacements, create)...)})
	var settle []task
	for range clusterPodUpdates {
		settle = append(settle, each(replacements, update)...)
	}
	phases = append(phases, phase{name: "rollout status", tasks: settle})

	start := time.Now()
	for _, p := range phases {
		if err := r.runPhase(ctx, p, rec); err != nil {
			return nil, fmt.Errorf("small cluster, %s: %w", p.name, err)
		}
	}
	res := rec.result(SmallCluster, "ops/s", time.Since(start))
	res.Writes, res.Pages = writes.Load(), reads.Load()
	// What is left: the nodes, their leases, the pods that were not deleted
	// and their replacements.
	deleted := make(map[*clusterObject]bool, len(gone))
	for _, o := range gone {
		deleted[o] = true
	}
	for _, group := range [][]*clusterObject{nodes, leases, pods, replacements} {
		for _, o := range group {
			if !deleted[o] {
				res.Keys++
				res.LiveBytes += int64(len(o.key) + o.size)
			}
		}
	}
	return res, nil
}

// clusterUpdate is GuaranteedUpdate with the revision from the watch cache:
// Txn{If mod==rev Then Put Else Get}; on a conflict it retries with the
// revision the Else branch returned, up to clusterUpdateTries times.
func (r *runner) clusterUpdate(ctx context.Context, cli *clientv3.Client, o *clusterObject) (bool, error) {
	failed := false
	for range clusterUpdateTries {
		rev := o.rev.Load()
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(o.key), "=", rev)).
			Then(clientv3.OpPut(o.key, randomValue(o.size))).
			Else(clientv3.OpGet(o.key)).
			Commit()
		if err != nil {
			return failed, err
		}
		if resp.Succeeded {
			// Keep the newest revision seen, as the churn does.
			for seen := resp.Header.Revision; ; {
				old := o.rev.Load()
				if seen <= old || o.rev.CompareAndSwap(old, seen) {
					break
				}
			}
			return failed, nil
		}
		failed = true
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			return failed, fmt.Errorf("update %s: object missing", o.key)
		}
		o.rev.CompareAndSwap(rev, kvs[0].ModRevision)
	}
	return failed, fmt.Errorf("update %s: still conflicting after %d tries", o.key, clusterUpdateTries)
}

// clusterUpdateTries bounds GuaranteedUpdate's retries (kube-apiserver's
// are unbounded): two writes of one object race only at a round's
// boundary, so a few tries always settle it.
const clusterUpdateTries = 10

// fullList is the reflector's paginated LIST of prefix (K2) and returns the
// objects and pages it read.
func (r *runner) fullList(ctx context.Context, cli *clientv3.Client, prefix string) (objects, pages int, err error) {
	end := prefix[:len(prefix)-1] + string(prefix[len(prefix)-1]+1)
	key, rev := prefix, int64(0)
	for {
		resp, err := cli.Get(ctx, key, clientv3.WithRange(end), clientv3.WithLimit(int64(r.cfg.ListLimit)), clientv3.WithRev(rev))
		if err != nil {
			return objects, pages, fmt.Errorf("list page at %q rev %d: %w", key, rev, err)
		}
		pages++
		objects += len(resp.Kvs)
		if rev == 0 {
			rev = resp.Header.Revision
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return objects, pages, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// task is one request of a phase; it reports whether a compare failed.
type task func(ctx context.Context, cli *clientv3.Client) (failedCompare bool, err error)

// phase is a set of requests made by clients closed-loop clients (0:
// Config.Clients), in order of their index.
type phase struct {
	name    string
	tasks   []task
	clients int
}

func each(objs []*clusterObject, f func(*clusterObject) task) []task {
	out := make([]task, len(objs))
	for i, o := range objs {
		out[i] = f(o)
	}
	return out
}

// runPhase runs every task of p once and records each. Errors of single
// requests are counted; only a cancelled ctx stops it.
func (r *runner) runPhase(ctx context.Context, p phase, rec *recorder) error {
	note(r.cfg.Progress, "small cluster: %s (%d requests)", p.name, len(p.tasks))
	start := time.Now()
	clients := p.clients
	if clients <= 0 {
		clients = r.cfg.Clients
	}
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for c := range min(clients, len(p.tasks)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= len(p.tasks) {
					return
				}
				t0 := time.Now()
				failed, err := p.tasks[i](ctx, r.conn(c))
				if !rec.outcome(ctx, c, t0, failed, err) {
					return
				}
			}
		}()
	}
	wg.Wait()
	note(r.cfg.Progress, "")
	r.log.Info("small cluster phase done", "phase", p.name, "requests", len(p.tasks), "took", time.Since(start))
	return ctx.Err()
}
