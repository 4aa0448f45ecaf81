package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// machine is what the report says about the computer the run used.
type machine struct {
	CPUs       int
	CPUModel   string
	MemoryGiB  float64
	Kernel     string
	LoadBefore string
	LoadAfter  string
	// FsyncP50 and FsyncP99 are the latency of a 4 KiB write + fdatasync
	// in the data directory's file system.
	FsyncP50, FsyncP99 time.Duration
	FsyncCount         int
}

func probeMachine(dir string) (machine, error) {
	m := machine{CPUs: runtime.NumCPU(), LoadBefore: loadavg()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			m.MemoryGiB = float64(kb) / (1 << 20)
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	p50, p99, n, err := fsyncProbe(dir, 2*time.Second)
	if err != nil {
		return m, err
	}
	m.FsyncP50, m.FsyncP99, m.FsyncCount = p50, p99, n
	return m, nil
}

// fsyncProbe measures what every durable store pays per commit: a 4 KiB
// append and fdatasync, repeated for d.
func fsyncProbe(dir string, d time.Duration) (p50, p99 time.Duration, n int, err error) {
	f, err := os.CreateTemp(dir, "fsync-probe")
	if err != nil {
		return 0, 0, 0, fmt.Errorf("fsync probe: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	var lat []time.Duration
	for end := time.Now().Add(d); time.Now().Before(end); {
		t0 := time.Now()
		if _, err := f.Write(buf); err != nil {
			return 0, 0, 0, fmt.Errorf("fsync probe write: %w", err)
		}
		if err := f.Sync(); err != nil {
			return 0, 0, 0, fmt.Errorf("fsync probe sync: %w", err)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100], len(lat), nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// versionOf runs a binary's version command and returns its first line.
func versionOf(ctx context.Context, bin string, args ...string) string {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, bin, args...).Output()
	if err != nil {
		return "unknown (" + filepath.Base(bin) + ": " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[:min(len(lines), 2)], "; ")
}
