package workload

import (
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"
)

// startProgress redraws one status line on w every 200 ms until the returned
// stop is called, which clears it. With a nil w it does nothing, so callers
// decide once (not a terminal, --quiet) whether progress is shown.
func startProgress(w io.Writer, name string, start time.Time, total time.Duration, ops, errs *atomic.Int64) (stop func()) {
	if w == nil {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				fmt.Fprintf(w, "\r%s\r", strings.Repeat(" ", 100))
				return
			case <-t.C:
				fmt.Fprint(w, "\r"+progressLine(name, time.Since(start), total, ops.Load(), errs.Load()))
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// progressLine renders e.g.
// "create   [########------------]  4.0s/10s    41234 ops   10.3k/s  0 err".
func progressLine(name string, elapsed, total time.Duration, ops, errs int64) string {
	const width = 20
	frac := float64(elapsed) / float64(total)
	frac = min(max(frac, 0), 1)
	filled := int(frac * width)
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(ops) / s
	}
	return fmt.Sprintf("%-8s [%s%s] %5.1fs/%s %9d ops %9.1f/s %d err  ", name,
		strings.Repeat("#", filled), strings.Repeat("-", width-filled),
		elapsed.Seconds(), total, ops, rate, errs)
}

// note prints a one-off status line (e.g. "preloading") where progress goes.
func note(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, "\r%-100s", fmt.Sprintf(format, args...))
	}
}
