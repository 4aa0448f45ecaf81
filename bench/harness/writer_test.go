package main

import (
	"bufio"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseCounter(t *testing.T) {
	text := `# HELP engram_mvcc_writer_busy_seconds_total Seconds the writer spent.
# TYPE engram_mvcc_writer_busy_seconds_total counter
engram_mvcc_writer_busy_seconds_total 1.5
engram_mvcc_writer_busy_seconds_total_other 7
engram_mvcc_writer_busy_seconds_total{phase="apply"} 0.25
go_goroutines 12
`
	v, ok := parseCounter(bufio.NewScanner(strings.NewReader(text)), writerBusyMetric)
	if !ok || v != 1.75 {
		t.Errorf("parseCounter = %v, %v; want 1.75, true", v, ok)
	}
	if _, ok := parseCounter(bufio.NewScanner(strings.NewReader("go_goroutines 12\n")), writerBusyMetric); ok {
		t.Error("parseCounter found a counter that is absent")
	}
}

func TestWriterPerOp(t *testing.T) {
	us := []cpuUse{
		{Writer: 100 * time.Millisecond, WriterKnown: true, Ops: 1000}, // 100 µs/op
		{Writer: 300 * time.Millisecond, WriterKnown: true, Ops: 1000}, // 300 µs/op
		{Writer: time.Second, Ops: 1000},                               // not measured
	}
	if got := writerPerOp(us); got != 200 {
		t.Errorf("writerPerOp = %v, want 200", got)
	}
	if got := oneWriterAllows(200); got != 5000 {
		t.Errorf("oneWriterAllows(200) = %v, want 5000", got)
	}
	if !math.IsNaN(writerPerOp(us[2:])) || fmtUS(writerPerOp(nil)) != "–" {
		t.Error("an unmeasured writer time must show as –")
	}
}
