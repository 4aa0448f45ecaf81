package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Store kinds the harness can start.
const (
	storeCeiling = "ceiling"
	storeEtcd    = "etcd"
	storeBadger  = "engram-badger"
	storePebble  = "engram-pebble"
	storeMemkv   = "engram-memkv"
	storeWasm    = "engram-wasm"
)

// storeInfo describes a store for the report.
var storeInfo = map[string]string{
	storeCeiling: "bench/ceiling: answers at once, stores nothing (the machine's limit)",
	storeEtcd:    "etcd 3.6 built from the module proxy (bench/etcd), defaults: fsync on every commit",
	storeBadger:  "Engram on badger (the default engine): every acknowledged write fsynced",
	storePebble:  "Engram on pebble (storage.engine=pebble, its defaults): every acknowledged write fsynced",
	storeMemkv:   "Engram on memkv: in memory, no durability",
	storeWasm:    "Engram on memkv.wasm through the WebAssembly host: in memory, no durability; its linear memory cap raised from the default 256 MiB to the wasm32 maximum of 4 GiB, so it can hold what native memkv holds",
	// The SQL stores (sql.go) share one database server per database, a
	// fresh database for every run.
	storePostgres:     "Engram on PostgreSQL through bin/postgres.wasm (the adaptor's defaults: 4 instances of up to 4 connections)",
	storeMySQL:        "Engram on MariaDB through bin/mysql.wasm (the adaptor's defaults: 4 instances of up to 4 connections)",
	storeKinePostgres: "kine (k3s's etcd shim, bench/kine) on the same PostgreSQL, its defaults (at most 20 idle connections, no cap on open ones); measured on create only (see the SQL section)",
	storeKineMySQL:    "kine (bench/kine) on the same MariaDB, its defaults; measured on create only (see the SQL section)",
}

// server is one running store process.
type server struct {
	name     string
	cmd      *exec.Cmd
	endpoint string // host:port of the etcd API
	httpAddr string // Engram's ops endpoint (pprof), "" for others
	log      string
	exited   chan struct{}
	args     []string
}

// freePort asks the kernel for a free port on 127.0.0.1. Another process
// may take it before the server binds it; start retries on that.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startStore starts a fresh store of the given kind with its data under dir
// and waits until it serves.
func (h *harness) startStore(ctx context.Context, kind, dir string) (*server, error) {
	var lastErr error
	for attempt := range 3 {
		s, err := h.tryStart(ctx, kind, filepath.Join(dir, fmt.Sprintf("%s-%d", kind, attempt)))
		if err == nil {
			return s, nil
		}
		lastErr = err
		h.log.Warn("store did not start, retrying with new ports", "store", kind, "err", err)
	}
	return nil, lastErr
}

func (h *harness) tryStart(ctx context.Context, kind, dir string) (*server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &server{name: kind, endpoint: fmt.Sprintf("127.0.0.1:%d", port), log: filepath.Join(dir, "server.log"), exited: make(chan struct{})}
	var bin string
	var ready func(context.Context) error
	switch kind {
	case storeCeiling:
		bin = h.ceilingBin
		s.args = []string{"--listen=" + s.endpoint, fmt.Sprintf("--value-size=%d", h.p.valueSize), fmt.Sprintf("--list-keys=%d", h.p.dataSet)}
		ready = func(ctx context.Context) error { return dialable(ctx, s.endpoint) }
	case storeEtcd:
		peer, err := freePort()
		if err != nil {
			return nil, err
		}
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
		bin = h.etcdBin
		s.args = []string{"--name=bench", "--data-dir=" + filepath.Join(dir, "data"),
			"--listen-client-urls=http://" + s.endpoint, "--advertise-client-urls=http://" + s.endpoint,
			"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=bench=" + peerURL, "--log-level=error"}
		if h.scale.etcdQuota > 0 {
			// The scale run's millions of objects outgrow the 2 GiB default.
			s.args = append(s.args, fmt.Sprintf("--quota-backend-bytes=%d", h.scale.etcdQuota))
		}
		ready = func(ctx context.Context) error { return httpOK(ctx, "http://"+s.endpoint+"/health") }
	case storeBadger, storePebble, storeMemkv, storeWasm:
		hp, err := freePort()
		if err != nil {
			return nil, err
		}
		s.httpAddr = fmt.Sprintf("127.0.0.1:%d", hp)
		bin = h.engramBin
		level := "warn"
		if h.churn.running {
			// The churn reports what the engine's reclamation did,
			// which it logs at info.
			level = "info"
		}
		s.args = append([]string{"serve", "--listen-client-urls=http://" + s.endpoint, "--http.listen=" + s.httpAddr,
			"--data-dir=" + filepath.Join(dir, "data"), "--log.level=" + level}, engramStorageArgs(kind, h.wasmFile)...)
		ready = func(ctx context.Context) error { return httpOK(ctx, "http://"+s.httpAddr+"/readyz") }
	case storePostgres, storeMySQL:
		if bin, s.args, s.httpAddr, err = h.sqlArgs(kind, s.endpoint, filepath.Join(dir, "data")); err != nil {
			return nil, err
		}
		ready = func(ctx context.Context) error { return httpOK(ctx, "http://"+s.httpAddr+"/readyz") }
	case storeKinePostgres, storeKineMySQL:
		if bin, s.args, _, err = h.sqlArgs(kind, s.endpoint, ""); err != nil {
			return nil, err
		}
		ready = func(ctx context.Context) error { return dialable(ctx, s.endpoint) }
	default:
		return nil, fmt.Errorf("unknown store %q", kind)
	}
	logf, err := os.Create(s.log)
	if err != nil {
		return nil, fmt.Errorf("server log: %w", err)
	}
	defer logf.Close()
	s.cmd = exec.Command(bin, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", kind, err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	startTimeout := 60 * time.Second
	if h.scale.startTimeout > 0 {
		// A restart on millions of objects (etcd rebuilds its index) takes longer.
		startTimeout = h.scale.startTimeout
	}
	rctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		err := ready(rctx)
		if err == nil {
			return s, nil
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("%s exited during start; log %s:\n%s", kind, s.log, tail(s.log))
		case <-rctx.Done():
			s.stop()
			return nil, fmt.Errorf("%s not ready after %s: %w", kind, startTimeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// engramStorageArgs are the storage settings of an Engram store kind, the
// same for serve and snapshot restore.
func engramStorageArgs(kind, wasmFile string) []string {
	switch kind {
	case storePebble:
		return []string{"--storage.engine=pebble"}
	case storeMemkv:
		return []string{"--storage.engine=memkv"}
	case storeWasm:
		return []string{"--storage.engine=wasm", "--storage.wasm.file=" + wasmFile, "--storage.wasm.memory-limit=4294967296"}
	}
	return nil
}

// command is the shell-quotable command line that started s.
func (s *server) command() string {
	return filepath.Base(s.cmd.Path) + " " + strings.Join(s.args, " ")
}

// stop sends SIGTERM and, after 20 s, SIGKILL.
func (s *server) stop() {
	if s == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// memory reads the server's resident set from /proc/PID/status, in bytes:
// the total (VmRSS) and its anonymous and file-backed parts (etcd's bbolt
// pages are file-backed mmap).
type memory struct{ RSS, Anon, File int64 }

func (s *server) memory() (memory, error) { return readMemory(s.cmd.Process.Pid) }

func readMemory(pid int) (memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, fmt.Errorf("read status: %w", err)
	}
	var m memory
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			m.RSS = kb << 10
		case "RssAnon:":
			m.Anon = kb << 10
		case "RssFile:":
			m.File = kb << 10
		}
	}
	if m.RSS == 0 {
		return m, errors.New("no VmRSS in /proc status")
	}
	return m, nil
}

func dialable(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

func httpOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// tail returns the last lines of a log file for error messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// diskStores parses flag's comma-separated list of stores, each one with a
// data directory to measure.
func diskStores(flag, list string) ([]string, error) {
	var stores []string
	for _, store := range strings.Split(list, ",") {
		switch store {
		case "":
		case storeEtcd, storeBadger, storePebble:
			stores = append(stores, store)
		default:
			return nil, fmt.Errorf("%s: %q has no disk to measure (want %s, %s or %s)", flag, store, storeEtcd, storeBadger, storePebble)
		}
	}
	return stores, nil
}

// measureStore runs one store's measurement named what. A store failing (a
// crash, a refused request) is a result to report, not a reason to lose the
// others: its error comes back as failure, and err is set only when ctx
// ended the run.
func (h *harness) measureStore(ctx context.Context, what, store string, measure func() error) (failure string, err error) {
	if err := measure(); err != nil {
		if ctx.Err() != nil {
			return "", err
		}
		h.log.Error(what+" failed", "store", store, "err", err)
		return err.Error(), nil
	}
	return "", nil
}
