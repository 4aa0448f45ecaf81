package workload

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/engramkv/engram/bench/result"
)

// Latencies are recorded in microseconds from 1 µs to 5 minutes with three
// significant digits (0.1% error), the accuracy HdrHistogram is made for.
const (
	minMicros  = 1
	maxMicros  = 5 * 60 * 1_000_000
	sigFigures = 3
	// shards spreads recording over several histograms so 300 clients do
	// not queue on one lock; a histogram of this range is ~150 KiB, so one
	// per client would cost 45 MiB.
	shards         = 16
	maxErrorSample = 5
)

// recorder gathers one workload's latencies and counters.
type recorder struct {
	shards [shards]struct {
		mu sync.Mutex
		h  *hdrhistogram.Histogram
	}
	ops, failed, errs atomic.Int64

	mu      sync.Mutex
	samples []string
}

func newRecorder() *recorder {
	r := &recorder{}
	for i := range r.shards {
		r.shards[i].h = hdrhistogram.New(minMicros, maxMicros, sigFigures)
	}
	return r
}

// record adds one operation's latency; i picks the shard (any stable
// per-client number).
func (r *recorder) record(i int, d time.Duration) {
	us := d.Microseconds()
	if us < minMicros {
		us = minMicros
	}
	if us > maxMicros {
		us = maxMicros
	}
	s := &r.shards[i%shards]
	s.mu.Lock()
	_ = s.h.RecordValue(us)
	s.mu.Unlock()
	r.ops.Add(1)
}

// outcome records an operation client i started at t0: its latency, or its
// error, and a failed compare. It reports false when the error came from
// the run's end (ctx done), which is nobody's failure and ends the client.
func (r *recorder) outcome(ctx context.Context, i int, t0 time.Time, failed bool, err error) bool {
	switch {
	case err != nil && ctx.Err() != nil:
		return false
	case err != nil:
		r.fail(err)
		return true
	}
	r.record(i, time.Since(t0))
	if failed {
		r.failed.Add(1)
	}
	return true
}

// fail counts an error and keeps its text if it is one of the first few
// distinct ones.
func (r *recorder) fail(err error) {
	r.errs.Add(1)
	msg := err.Error()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.samples) >= maxErrorSample {
		return
	}
	for _, s := range r.samples {
		if s == msg {
			return
		}
	}
	r.samples = append(r.samples, msg)
}

func (r *recorder) result(name, unit string, elapsed time.Duration) *result.Result {
	all := hdrhistogram.New(minMicros, maxMicros, sigFigures)
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		all.Merge(s.h)
		s.mu.Unlock()
	}
	ms := func(us int64) float64 { return float64(us) / 1000 }
	res := &result.Result{
		Workload:       name,
		Unit:           unit,
		Seconds:        elapsed.Seconds(),
		Ops:            r.ops.Load(),
		FailedCompares: r.failed.Load(),
		Errors:         r.errs.Load(),
		Latency: result.Latency{
			P50:  ms(all.ValueAtQuantile(50)),
			P90:  ms(all.ValueAtQuantile(90)),
			P99:  ms(all.ValueAtQuantile(99)),
			P999: ms(all.ValueAtQuantile(99.9)),
			Max:  ms(all.Max()),
			Mean: all.Mean() / 1000,
		},
	}
	if elapsed > 0 {
		res.Throughput = float64(res.Ops) / elapsed.Seconds()
	}
	r.mu.Lock()
	res.ErrorSamples = append([]string(nil), r.samples...)
	r.mu.Unlock()
	return res
}
