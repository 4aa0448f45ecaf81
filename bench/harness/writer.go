package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// writerBusyMetric is the Prometheus counter of the seconds Engram's single
// MVCC writer goroutine spent evaluating requests (core/internal/mvcc).
// Its growth over a workload's measured interval, divided by the
// operations, is the serial time each operation costs the writer, and one
// second over it the throughput one writer allows, whatever the cores.
const writerBusyMetric = "engram_mvcc_writer_busy_seconds_total"

// writerBusy scrapes the counter from an Engram server's /metrics. ok is
// false when the server has no metrics endpoint or does not export the
// counter (a build from before it was added).
func writerBusy(ctx context.Context, httpAddr string) (busy time.Duration, ok bool) {
	secs, ok := scrapeCounter(ctx, httpAddr, writerBusyMetric)
	return time.Duration(secs * float64(time.Second)), ok
}

// scrapeCounter reads the counter name from the server's /metrics at
// addr (host:port); ok is false when there is none.
func scrapeCounter(ctx context.Context, addr, name string) (float64, bool) {
	if addr == "" {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false
	}
	return parseCounter(bufio.NewScanner(resp.Body), name)
}

// parseCounter sums the samples of the counter name in Prometheus' text
// format (one per label set, if it has labels).
func parseCounter(sc *bufio.Scanner, name string) (float64, bool) {
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sum, found := 0.0, false
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue // a comment, another metric, or one whose name only starts so
		}
		if i := strings.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil || math.IsNaN(v) {
			continue
		}
		sum, found = sum+v, true
	}
	return sum, found && sc.Err() == nil
}

// writerPerOp is the median over repeats of the writer's serial
// microseconds per operation, NaN when no repeat measured it.
func writerPerOp(us []cpuUse) float64 {
	var v []float64
	for _, u := range us {
		if u.WriterKnown && u.Ops > 0 {
			v = append(v, float64(u.Writer.Nanoseconds())/1e3/float64(u.Ops))
		}
	}
	return medianOf(v)
}

// oneWriterAllows is the throughput a writer that spends perOp µs of serial
// time on each operation allows: 1 s / perOp.
func oneWriterAllows(perOp float64) float64 {
	if math.IsNaN(perOp) || perOp <= 0 {
		return math.NaN()
	}
	return 1e6 / perOp
}

// fmtUS formats microseconds for the table, "–" when unknown.
func fmtUS(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	if v < 10 {
		return fmt.Sprintf("%.2f", v)
	}
	return fnum(v)
}
