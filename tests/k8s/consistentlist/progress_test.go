package consistentlist

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/tests/k8s/internal/backend"
)

// BenchmarkRequestProgress times what the watch cache waits for in a
// consistent read, without the cache: read the store's revision (a Get, as
// GetCurrentResourceVersion does), ask for progress on a watch stream that
// holds 70 watchers of their own prefixes (one per cached resource, as
// kube-apiserver's cache stream does), and wait for a progress response at
// or above that revision, asking again every 100 ms as the cache's progress
// requester does. Writes go to the watched prefixes meanwhile at about
// 200/s. ms/op includes a 5 ms pause between reads.
func BenchmarkRequestProgress(b *testing.B) {
	const watchers = 70
	c := backend.Client(b).Client
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	wctx := clientv3.WithRequireLeader(ctx)
	progress := make(chan int64, 1024)
	var opened sync.WaitGroup
	for i := range watchers {
		opened.Add(1)
		wch := c.Watch(wctx, fmt.Sprintf("/r%02d/", i), clientv3.WithPrefix(), clientv3.WithPrevKV(),
			clientv3.WithProgressNotify(), clientv3.WithCreatedNotify())
		go func() {
			for r := range wch {
				switch {
				case r.Created:
					opened.Done()
				case r.IsProgressNotify() && i == 0:
					// A progress response to the stream reaches
					// every watcher; one of them reports it.
					progress <- r.Header.Revision
				}
			}
		}()
	}
	opened.Wait()
	var writers sync.WaitGroup
	defer func() {
		stop()
		writers.Wait()
	}()
	for w := range 4 {
		writers.Go(func() {
			gaps := rand.New(rand.NewPCG(uint64(w), 1))
			for j := 0; ; j++ {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Duration(gaps.ExpFloat64() * float64(20*time.Millisecond))):
				}
				_, _ = c.Put(ctx, fmt.Sprintf("/r%02d/k%03d", gaps.IntN(watchers), j%100), "v")
			}
		})
	}
	var waits []time.Duration
	for b.Loop() {
		resp, err := c.Get(ctx, "/registry/pods")
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := c.RequestProgress(wctx); err != nil {
			b.Fatal(err)
		}
		again := time.NewTicker(100 * time.Millisecond)
	wait:
		for {
			select {
			case rev := <-progress:
				if rev >= resp.Header.Revision {
					break wait
				}
			case <-again.C:
				if err := c.RequestProgress(wctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		again.Stop()
		waits = append(waits, time.Since(start))
		// The benchmark's pace between requests (the writers' load goes
		// on meanwhile), not a wait for an event.
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
	b.StopTimer()
	slices.Sort(waits)
	b.ReportMetric(float64(waits[len(waits)/2].Microseconds())/1000, "wait-p50-ms")
	b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds())/1000, "wait-p99-ms")
}
