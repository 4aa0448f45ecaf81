package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// profiledWorkloads are the workloads whose server CPU profile the report
// shows: every one with a target against the ceiling, so that a target not
// met comes with what bounds it.
var profiledWorkloads = map[string]bool{"create": true, "get": true, "update": true, "list": true, "delete": true}

// measuringLine and measuredLine are what engram bench --verbose logs when
// a workload's measured interval starts and ends (bench/workload
// runner.drive).
var (
	measuringLine = regexp.MustCompile(`msg=measuring workload=(\w+)`)
	measuredLine  = regexp.MustCompile(`msg=measured workload=(\w+) ops=(\d+)`)
)

// benchWatcher follows one engram bench run through its log: it reads the
// CPU time the server and the load generator spent in each workload's
// measured interval, and, when profile is set, takes a server CPU profile of
// each profiled workload (triggered by the generator's own line, so that
// preloading is left out).
type benchWatcher struct {
	h       *harness
	srv     *server
	genPid  int
	profile bool

	wg    sync.WaitGroup
	mu    sync.Mutex
	top   map[string]string // workload -> pprof -top -cum
	cpu   map[string]cpuUse // workload -> CPU in its measured interval
	start map[string]cpuUse // workload -> CPU times when it started
}

// cpuUse is the CPU time (user + system) of the server and of the load
// generator over one workload's measured interval, and the operations it
// completed.
type cpuUse struct {
	Server, Generator time.Duration
	Ops               int64
	// Writer is the growth of Engram's writer busy counter over the
	// interval (writer.go); WriterKnown is false where the server does
	// not export it.
	Writer      time.Duration
	WriterKnown bool
}

// watch reads engram bench's stderr, forwards it to ours, and acts on the
// measuring and measured lines. It returns at EOF.
func (w *benchWatcher) watch(ctx context.Context, stderr io.Reader) {
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		line := sc.Text()
		if m := measuringLine.FindStringSubmatch(line); m != nil {
			w.start[m[1]] = w.cpuNow(ctx)
			if w.profile && profiledWorkloads[m[1]] {
				w.wg.Add(1)
				go w.profileWorkload(ctx, m[1])
			}
			continue
		}
		if m := measuredLine.FindStringSubmatch(line); m != nil {
			if s, ok := w.start[m[1]]; ok {
				now := w.cpuNow(ctx)
				ops, _ := strconv.ParseInt(m[2], 10, 64)
				w.cpu[m[1]] = cpuUse{Server: now.Server - s.Server, Generator: now.Generator - s.Generator, Ops: ops,
					Writer: now.Writer - s.Writer, WriterKnown: s.WriterKnown && now.WriterKnown}
			}
			continue
		}
		fmt.Fprintln(os.Stderr, line)
	}
}

func (w *benchWatcher) cpuNow(ctx context.Context) cpuUse {
	u := cpuUse{Server: processCPU(w.srv.cmd.Process.Pid), Generator: processCPU(w.genPid)}
	u.Writer, u.WriterKnown = writerBusy(ctx, w.srv.httpAddr)
	return u
}

func (w *benchWatcher) profileWorkload(ctx context.Context, wl string) {
	defer w.wg.Done()
	top, err := w.h.cpuProfile(ctx, w.srv, wl)
	if err != nil {
		w.h.log.Warn("profile", "workload", wl, "err", err)
		return
	}
	w.mu.Lock()
	w.top[wl] = top
	w.mu.Unlock()
}

// clockTicks is the unit of /proc/PID/stat's CPU times (USER_HZ, 100 on
// every Linux architecture the harness runs on).
const clockTicks = 100

// processCPU is the user + system CPU time of a process (0 when it cannot be
// read: the process is gone).
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces, so fields are counted
	// from its closing parenthesis; utime and stime are fields 14 and 15.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * time.Second / clockTicks
}

// runBench runs an engram bench command (started with --verbose) with its
// stderr going through a watcher, and records what the watcher measured.
func (h *harness) runBench(ctx context.Context, cmd *exec.Cmd, store string, srv *server, profile bool) error {
	cmd.Stderr = nil
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	w := &benchWatcher{h: h, srv: srv, genPid: cmd.Process.Pid, profile: profile,
		top: map[string]string{}, cpu: map[string]cpuUse{}, start: map[string]cpuUse{}}
	w.watch(ctx, pipe) // returns at EOF, which comes before Wait closes the pipe
	err = cmd.Wait()
	w.wg.Wait()
	if profile {
		h.profiles = w.top
	}
	if h.cpu[store] == nil {
		h.cpu[store] = map[string][]cpuUse{}
	}
	for wl, u := range w.cpu {
		h.cpu[store][wl] = append(h.cpu[store][wl], u)
	}
	return err
}

// cpuProfile profiles srv for most of one workload's duration (the last
// half second is left out: the next workload's preload may start then) and
// returns pprof's cumulative top.
func (h *harness) cpuProfile(ctx context.Context, srv *server, workload string) (string, error) {
	secs := max(1, int((h.p.duration - 500*time.Millisecond).Seconds()))
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", srv.httpAddr, secs)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	if err := os.MkdirAll(h.profileDir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(h.profileDir, fmt.Sprintf("%s-%s.cpu.pprof", srv.name, workload))
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	_, err = io.Copy(f, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("save %s: %w", path, err)
	}
	// Cumulative order shows where the time goes (transport, MVCC, engine,
	// fsync) rather than which leaf functions are hot.
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-cum", "-nodecount=30", h.engramBin, path).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("pprof -top: %w: %s", err, out)
	}
	return fmt.Sprintf("$ go tool pprof -top -cum -nodecount=30 bin/engram %s\n%s", h.relToRepo(path), out), nil
}

// relToRepo shortens a path under the repository for the report.
func (h *harness) relToRepo(path string) string {
	if rel, err := filepath.Rel(h.repoRoot, path); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return path
}

// writeProfiles is the report's section of server CPU profiles.
func (h *harness) writeProfiles(b *strings.Builder) {
	if len(h.profiles) == 0 {
		return
	}
	fmt.Fprintf(b, "\n## CPU profiles: Engram on badger\n\n")
	fmt.Fprintf(b, "Taken from the server's `/debug/pprof/profile` during the measured interval of each workload of the first repeat (started when `engram bench --verbose` logs `measuring`, so preloads are left out; the files are saved next to the chart). The load generator ran on the same cores, so samples add up to less than the machine.\n")
	for _, wl := range allWorkloads {
		if top, ok := h.profiles[wl]; ok {
			fmt.Fprintf(b, "\n### %s\n\n```\n%s```\n", wl, top)
		}
	}
}

// writeCPU is the table of CPU time per operation: on a machine the load
// generator shares with the server, throughput is bounded by the CPUs over
// the two processes' CPU per operation, which places a store's distance
// from the ceiling in the server or in the generator.
func (h *harness) writeCPU(b *strings.Builder, stores []string) {
	if len(h.cpu) == 0 {
		return
	}
	fmt.Fprintf(b, "\nCPU time per operation (user + system from `/proc/PID/stat` over each workload's measured interval, median of the repeats): the server's, the load generator's, and the throughput the machine's %d CPUs would allow if both spent only that (CPUs / total). ", h.machine.CPUs)
	fmt.Fprintf(b, "A store whose server needs more CPU per operation than the ceiling's leaves less of the shared CPUs to the generator; where the bound is near the measured throughput, CPU is what limits it, and where it is far above, waiting is (fsync, the serial write group). ")
	fmt.Fprintf(b, "For Engram, writer µs/op is the serial time of its single MVCC writer per operation (the growth of `%s` on the server's `/metrics` over the interval, divided by the operations; – where the server does not export it), and one writer allows is 1 s over it: the throughput no number of cores can raise. ", writerBusyMetric)
	fmt.Fprintf(b, "For the SQL stores, server CPU is the Engram or kine process only, not the database server's.\n\n")
	fmt.Fprintf(b, "| workload | store | server µs/op | generator µs/op | total µs/op | CPU bound | writer µs/op | one writer allows | measured |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, wl := range allWorkloads {
		for _, s := range stores {
			us := h.cpu[s][wl]
			if len(us) == 0 {
				continue
			}
			med := func(f func(cpuUse) float64) float64 {
				var v []float64
				for _, u := range us {
					if u.Ops > 0 {
						v = append(v, f(u)/float64(u.Ops))
					}
				}
				return medianOf(v)
			}
			srv := med(func(u cpuUse) float64 { return float64(u.Server.Microseconds()) })
			gen := med(func(u cpuUse) float64 { return float64(u.Generator.Microseconds()) })
			bound := math.NaN()
			if srv+gen > 0 {
				bound = float64(h.machine.CPUs) * 1e6 / (srv + gen)
			}
			wr := writerPerOp(us)
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", wl, s, fnum(srv), fnum(gen), fnum(srv+gen), fnum(bound),
				fmtUS(wr), fnum(oneWriterAllows(wr)), fnum(median(h.results(s, wl), tput)))
		}
	}
}

// medianOf is the median of v (NaN when empty).
func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if n := len(v); n%2 == 1 {
		return v[n/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// saveHeapProfile saves srv's heap profile (what holds the memory the
// report's memory table shows) as <profile-dir>/profiles/<name>.heap.pprof.
func (h *harness) saveHeapProfile(ctx context.Context, srv *server, name string) {
	if h.profileDir == "" || srv.httpAddr == "" {
		return
	}
	err := func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+srv.httpAddr+"/debug/pprof/heap", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("heap profile: %s", resp.Status)
		}
		dir := filepath.Join(h.profileDir, "profiles")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		f, err := os.Create(filepath.Join(dir, name+".heap.pprof"))
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, resp.Body); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}()
	if err != nil {
		h.log.Warn("heap profile", "server", srv.name, "err", err)
	}
}
