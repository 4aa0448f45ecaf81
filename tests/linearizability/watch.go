package linearizability

import (
	"context"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Watcher watches the whole key set from revision 1 and records every
// event. When its watch ends (an error, a node killed, no leader) it
// watches again from the revision after the last one it received, and
// records the restart, so the checker can verify each resumption.
type Watcher struct {
	rec    *Recorder
	cli    *clientv3.Client
	cancel context.CancelFunc
	done   chan struct{}

	// last is the revision of the last event received.
	last *progress

	mu   sync.Mutex
	ends map[string]int
}

// StartWatcher connects to endpoints and starts watching.
func StartWatcher(ctx context.Context, rec *Recorder, endpoints []string) (*Watcher, error) {
	cli, err := NewClient(endpoints)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	// Revision 1 is an empty store's: no event carries it, so a watcher
	// that starts there has everything up to it.
	w := &Watcher{rec: rec, cli: cli, cancel: cancel, done: make(chan struct{}), last: newProgress(1), ends: map[string]int{}}
	go w.run(ctx)
	return w, nil
}

func (w *Watcher) run(ctx context.Context) {
	defer close(w.done)
	defer w.cli.Close()
	next := int64(1)
	for ctx.Err() == nil {
		w.rec.WatchStarted(next)
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		reason := "channel closed"
		for wr := range w.cli.Watch(wctx, KeyPrefix, clientv3.WithPrefix(), clientv3.WithRev(next)) {
			if err := wr.Err(); err != nil {
				reason = shortErr(err)
				break
			}
			if len(wr.Events) == 0 {
				continue
			}
			now := w.rec.Now()
			evs := make([]WatchEvent, 0, len(wr.Events))
			for _, ev := range wr.Events {
				we := WatchEvent{Recv: now, Key: KeyIndex(string(ev.Kv.Key)), KV: fromKV(ev.Kv)}
				we.Type = EventPut
				if ev.Type == mvccpb.DELETE {
					we.Type, we.KV = EventDelete, KeyValue{Mod: ev.Kv.ModRevision}
				}
				evs = append(evs, we)
			}
			w.rec.AddEvents(evs...)
			next = evs[len(evs)-1].Rev() + 1
			w.last.advance(next - 1)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		w.ends[reason]++
		w.mu.Unlock()
		// Pace the re-watch while the cluster recovers (not
		// synchronisation: the next watch starts from next whatever
		// happened meanwhile).
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WaitFor waits until the watcher received revision rev, or ctx ends; it
// reports whether it did.
func (w *Watcher) WaitFor(ctx context.Context, rev int64) bool {
	_, ok := w.last.await(ctx, rev)
	return ok
}

// Stop ends the watcher and waits for it.
func (w *Watcher) Stop() {
	w.cancel()
	<-w.done
}

// Ends counts why the watch had to be restarted.
func (w *Watcher) Ends() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.ends))
	for k, v := range w.ends {
		out[k] = v
	}
	return out
}
