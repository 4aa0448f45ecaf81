package proctest

import (
	"syscall"
	"testing"
	"time"
)

// CPUTime is the user and system CPU time this process has used.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ReportCPU starts counting the process's CPU time and returns the function
// that reports it per op, as cpu-ns/op next to ns/op: on a shared 2-vCPU
// machine wall time moves with the neighbours' load, CPU time much less. It
// counts every goroutine of the process (GC included), so it is meaningful
// for benchmarks that run nothing else.
func ReportCPU(b *testing.B) func() {
	start := CPUTime()
	return func() {
		b.ReportMetric(float64(CPUTime()-start)/float64(b.N), "cpu-ns/op")
	}
}
