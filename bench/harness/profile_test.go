package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestProcessCPU reads this process's CPU time after spending some.
func TestProcessCPU(t *testing.T) {
	x := 0
	for i := range 200_000_000 {
		x ^= i
	}
	_ = x
	if got := processCPU(os.Getpid()); got <= 0 {
		t.Errorf("processCPU(self) = %v after a busy loop", got)
	}
	if got := processCPU(1 << 30); got != 0 {
		t.Errorf("processCPU(no such pid) = %v, want 0", got)
	}
}

// TestWatcherMetersMeasuredIntervals feeds the watcher engram bench's
// lines and checks that it records a workload only between its measuring
// and measured lines, and forwards the other lines.
func TestWatcherMetersMeasuredIntervals(t *testing.T) {
	self := exec.Command("true")
	self.Process = &os.Process{Pid: os.Getpid()}
	w := &benchWatcher{
		h:   &harness{log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		srv: &server{cmd: self}, genPid: os.Getpid(),
		top: map[string]string{}, cpu: map[string]cpuUse{}, start: map[string]cpuUse{},
	}
	log := strings.Join([]string{
		`time=x level=INFO msg="workload starting" workload=get`,
		`time=x level=INFO msg=measuring workload=get duration=5s`,
		`time=x level=INFO msg=measured workload=get ops=1234 seconds=5.01`,
		`time=x level=INFO msg=measured workload=list ops=7 seconds=5`, // no start: ignored
	}, "\n")
	w.watch(context.Background(), strings.NewReader(log))
	if got := w.cpu["get"]; got.Ops != 1234 || got.Server < 0 || got.Generator < 0 {
		t.Errorf("get: %+v, want 1234 ops", got)
	}
	if _, ok := w.cpu["list"]; ok {
		t.Error("list recorded without a measuring line")
	}
}

func TestMedianOf(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := medianOf(c.in); got != c.want {
			t.Errorf("medianOf(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
