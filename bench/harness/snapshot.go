package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// snapResult is one store's snapshot and restore of the objects the memory
// measurement loaded: `etcdctl snapshot save` against the loaded server,
// then the store's own restore tool on the file, then (when it worked) a
// server started on the restored data, asked for its key count and
// revision.
type snapResult struct {
	Objects int
	// Keys and Revision are what the loaded server holds (Range of the
	// whole keyspace, count only, after the snapshot: nothing writes).
	Keys     int64
	Revision int64

	SaveSeconds float64
	Size        int64 // bytes of the file etcdctl wrote, sha256 trailer included
	// ServerBefore is the server's resident memory just before the
	// snapshot; ServerPeak the highest VmRSS sampled every 50 ms while it
	// ran, PeakAnon the highest anonymous part (file-backed pages, etcd's
	// mmapped bbolt file, are reclaimable).
	ServerBefore   memory
	ServerPeak     int64
	ServerPeakAnon int64
	RSSSamples     int
	// SaveAllocBytes is what the server's Go heap allocated while it
	// made and sent the snapshot (go_memstats_alloc_bytes_total on its
	// /metrics; 0: not exported): the sender's garbage.
	SaveAllocBytes      float64
	SaveError           string `json:",omitempty"`
	RestoreSeconds      float64
	RestorePeakRSS      int64  // ru_maxrss of the restoring process, bytes
	RestoreError        string `json:",omitempty"`
	RestoreSkipped      string `json:",omitempty"` // why there is no restore
	StartSeconds        float64
	RestoredKeys        int64
	RestoredRevision    int64
	StartError          string `json:",omitempty"`
	SaveCmd, RestoreCmd string `json:"-"`
}

// mibps is size/seconds in MiB/s, 0 when either is unknown.
func mibps(size int64, secs float64) float64 {
	if size <= 0 || secs <= 0 {
		return 0
	}
	return float64(size) / (1 << 20) / secs
}

// allocMetric is the Go runtime's count of bytes allocated, which both
// etcd and Engram export.
const allocMetric = "go_memstats_alloc_bytes_total"

// restoreMemberPeer is the peer URL a restored etcd member records: a
// placeholder, since a single member never dials its own peer URL and the
// restored server is started with a fresh port.
const restoreMemberPeer = "http://127.0.0.1:2380"

// measureSnapshot snapshots srv, loaded by measureRSS, stops it, and
// restores the file into a fresh data directory of the same store kind. Its
// files are removed afterwards: at a million objects each is about a
// gigabyte.
func (h *harness) measureSnapshot(ctx context.Context, store string, srv *server) {
	res := snapResult{Objects: h.p.rssObjects}
	defer func() { h.snap[store] = res }()
	dir := filepath.Join(h.workDir, "snapshot", store)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		res.SaveError = err.Error()
		return
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "snapshot.db")

	var err error
	if res.ServerBefore, err = srv.memory(); err != nil {
		res.SaveError = err.Error()
		return
	}
	args := []string{"--endpoints=" + srv.endpoint, "--command-timeout=30m", "snapshot", "save", file}
	res.SaveCmd = "etcdctl " + strings.Join(args, " ")
	h.log.Info("snapshot save", "store", store)
	metricsAddr := srv.httpAddr
	if metricsAddr == "" {
		metricsAddr = srv.endpoint // etcd serves /metrics on its client URL
	}
	allocBefore, allocKnown := scrapeCounter(ctx, metricsAddr, allocMetric)
	stopSampling := sampleRSS(srv.cmd.Process.Pid, 50*time.Millisecond)
	start := time.Now()
	_, err = h.tool(ctx, h.etcdctlBin, args...)
	res.SaveSeconds = time.Since(start).Seconds()
	peak := stopSampling()
	if allocAfter, ok := scrapeCounter(ctx, metricsAddr, allocMetric); ok && allocKnown {
		res.SaveAllocBytes = allocAfter - allocBefore
	}
	res.ServerPeak, res.ServerPeakAnon, res.RSSSamples = peak.RSS, peak.Anon, peak.n
	if err != nil {
		res.SaveError = err.Error()
		return
	}
	st, err := os.Stat(file)
	if err != nil {
		res.SaveError = err.Error()
		return
	}
	res.Size = st.Size()
	// Counted after the snapshot (nothing writes meanwhile), so that the
	// count's own memory is not taken for the snapshot's.
	if res.Keys, res.Revision, err = h.countKeys(ctx, srv.endpoint); err != nil {
		res.SaveError = "counting keys: " + err.Error()
		return
	}
	h.log.Info("snapshot saved", "store", store, "bytes", res.Size, "took", time.Duration(res.SaveSeconds*float64(time.Second)).Round(time.Millisecond),
		"server RSS before", mib(res.ServerBefore.RSS), "peak", mib(res.ServerPeak), "keys", res.Keys, "revision", res.Revision)

	// The restore and the restored server run alone: the loaded server's
	// background work (badger compactions) must not share the cores.
	srv.stop()

	restoreDir := filepath.Join(dir, "restored")
	dataDir := filepath.Join(restoreDir, "data")
	var bin string
	switch store {
	case storeEtcd:
		bin = h.etcdutlBin
		args = []string{"snapshot", "restore", file, "--data-dir", dataDir, "--name=bench",
			"--initial-cluster=bench=" + restoreMemberPeer, "--initial-advertise-peer-urls=" + restoreMemberPeer}
		res.RestoreCmd = "etcdutl " + strings.Join(args, " ")
	case storeBadger, storePebble:
		bin = h.engramBin
		args = append([]string{"snapshot", "restore", file, "--data-dir=" + dataDir, "--log.level=warn"}, engramStorageArgs(store, h.wasmFile)...)
		res.RestoreCmd = "engram " + strings.Join(args, " ")
	default:
		// memkv and memkv.wasm keep nothing across processes: a
		// restore into them would be gone when the command exits.
		res.RestoreSkipped = "in-memory engine: nothing outlives the restoring process"
		return
	}
	h.log.Info("snapshot restore", "store", store)
	cmd := exec.CommandContext(ctx, bin, args...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start = time.Now()
	err = cmd.Run()
	res.RestoreSeconds = time.Since(start).Seconds()
	if cmd.ProcessState != nil {
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			res.RestorePeakRSS = ru.Maxrss << 10 // kilobytes on Linux
		}
	}
	if err != nil {
		res.RestoreError = fmt.Sprintf("%v: %s", err, oneLine(buf.String(), 600))
		return
	}
	h.log.Info("snapshot restored", "store", store, "took", time.Duration(res.RestoreSeconds*float64(time.Second)).Round(time.Millisecond), "peak RSS", mib(res.RestorePeakRSS))

	// The restored data must serve: start the store on it and compare
	// what it holds with what was snapshotted.
	start = time.Now()
	rs, err := h.startOn(ctx, store, restoreDir)
	if err != nil {
		res.StartError = err.Error()
		return
	}
	res.StartSeconds = time.Since(start).Seconds()
	res.RestoredKeys, res.RestoredRevision, err = h.countKeys(ctx, rs.endpoint)
	rs.stop()
	if err != nil {
		res.StartError = "counting keys: " + err.Error()
	} else if res.RestoredKeys != res.Keys || res.RestoredRevision != res.Revision {
		res.StartError = fmt.Sprintf("restored store holds %d keys at revision %d, the snapshotted one %d at %d", res.RestoredKeys, res.RestoredRevision, res.Keys, res.Revision)
	}
}

// startOn starts a store on the data directory dir/data that already
// exists, trying new ports when one was taken meanwhile.
func (h *harness) startOn(ctx context.Context, store, dir string) (*server, error) {
	var lastErr error
	for range 3 {
		s, err := h.tryStart(ctx, store, dir)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// countKeys asks the server at endpoint for its number of keys and its
// revision, with etcdctl (a Range over the whole keyspace, count only).
func (h *harness) countKeys(ctx context.Context, endpoint string) (keys, rev int64, err error) {
	out, err := h.tool(ctx, h.etcdctlBin, "--endpoints="+endpoint, "--command-timeout=5m", "get", "", "--from-key", "--count-only", "-w", "fields")
	if err != nil {
		return 0, 0, err
	}
	// Lines like `"Count" : 20000`.
	var gotKeys, gotRev bool
	for _, line := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(line, " : ")
		if !ok {
			continue
		}
		n, perr := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch strings.Trim(k, `"`) {
		case "Count":
			keys, gotKeys = n, perr == nil
		case "Revision":
			rev, gotRev = n, perr == nil
		}
	}
	if !gotKeys || !gotRev {
		return 0, 0, fmt.Errorf("etcdctl get --count-only: no count and revision in %q", out)
	}
	return keys, rev, nil
}

// tool runs etcdctl or etcdutl and returns its output; an error carries
// its standard error.
func (h *harness) tool(ctx context.Context, bin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, oneLine(stderr.String(), 600))
	}
	return out, nil
}

// rssPeak is the highest memory seen by sampleRSS.
type rssPeak struct {
	RSS, Anon int64
	n         int
}

// sampleRSS reads /proc/PID/status every interval until the returned
// function is called, which returns the peaks (taken separately: the
// highest VmRSS and the highest RssAnon).
func sampleRSS(pid int, interval time.Duration) func() rssPeak {
	var (
		mu   sync.Mutex
		peak rssPeak
		done = make(chan struct{})
		wg   sync.WaitGroup
	)
	take := func() {
		m, err := readMemory(pid)
		if err != nil {
			return
		}
		mu.Lock()
		peak.RSS, peak.Anon, peak.n = max(peak.RSS, m.RSS), max(peak.Anon, m.Anon), peak.n+1
		mu.Unlock()
	}
	take()
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				take()
			}
		}
	}()
	return func() rssPeak {
		close(done)
		wg.Wait()
		take()
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}
