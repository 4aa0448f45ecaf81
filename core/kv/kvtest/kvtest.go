// Package kvtest is the conformance suite for kv.Store adaptors.
//
// It owns the executable form of the contract documented in package kv: every
// adaptor's tests call Run, and the plugin verifier runs the same Cases
// through Verify to print a pass/fail report for an adaptor it cannot compile
// against (a .wasm plugin). The cases only use the kv.Store interface, so a
// passing adaptor is interchangeable with any other one as far as the core can
// tell. The cases of optional interfaces (kv.Sizer, kv.Reclaimer) run
// where the store implements them and are skipped, saying so, where it does
// not.
//
// This package must not import any engine or reach into an adaptor's
// internals, and it must not relax the contract to make an adaptor pass: an
// adaptor that cannot meet a limit declares it through Config, visibly, in
// its own test. Cases must stay fast (the whole suite well under ten seconds
// on two cores, including fsyncing engines) because every adaptor pays for it
// on every test run.
//
// It is public so that an adaptor outside this repository can run the same
// suite in its own tests.
package kvtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/engramkv/engram/core/kv"
)

// T is the part of *testing.T the cases use. It is an interface so that a
// runner outside `go test` (the plugin verifier) can drive the same cases.
// Fatalf must stop the calling goroutine the way testing.T.FailNow does; the
// cases only call it from the goroutine that runs the case.
type T interface {
	Helper()
	Name() string
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	// Skipf ends the case as skipped, the way testing.T.SkipNow does: a
	// case of an optional interface the store does not implement.
	Skipf(format string, args ...any)
}

// Case is one conformance check. Run receives a fresh, empty store and may
// close it; the runner closes it afterwards in any case.
type Case struct {
	Name string
	Run  func(ctx context.Context, t T, s kv.Store)
}

// Config tunes the suite for an adaptor. The zero value checks the contract
// exactly as written in package kv.
type Config struct {
	// MaxKeySize is the longest key the cases write; 0 means kv.MaxKeySize.
	// Setting it lower declares that the adaptor violates the contract's
	// key limit; do it only with a comment saying why.
	MaxKeySize int
	// MaxValueSize is the largest value the cases write; 0 means
	// kv.MaxValueSize. The same caveat applies.
	MaxValueSize int
	// CaseTimeout bounds one case; 0 means one minute. A case that hangs
	// (a deadlocked Commit, an iterator that never ends) fails instead of
	// stalling the whole run.
	CaseTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.MaxKeySize <= 0 {
		c.MaxKeySize = kv.MaxKeySize
	}
	if c.MaxValueSize <= 0 {
		c.MaxValueSize = kv.MaxValueSize
	}
	if c.CaseTimeout <= 0 {
		c.CaseTimeout = time.Minute
	}
	return c
}

// Cases returns the conformance checks, in the order they are best run:
// basic reads and writes first, so that a broken adaptor fails on the
// simplest symptom.
func Cases(cfg Config) []Case {
	cfg = cfg.withDefaults()
	return []Case{
		{Name: "Features", Run: caseFeatures},
		{Name: "GetAbsentAndPresent", Run: caseGet},
		{Name: "EmptyValues", Run: caseEmptyValues},
		{Name: "CopySemantics", Run: caseCopySemantics},
		{Name: "ByteOrder", Run: caseByteOrder},
		{Name: "ScanBoundsAndLimits", Run: caseScanBounds},
		{Name: "EmptyRanges", Run: caseEmptyRanges},
		{Name: "MultiBatchScan", Run: caseMultiBatch},
		{Name: "LargeValuesAndLongKeys", Run: cfg.caseLarge},
		{Name: "SnapshotIsolation", Run: caseSnapshotIsolation},
		{Name: "BatchAtomicity", Run: caseBatchAtomicity},
		{Name: "ConditionalConflicts", Run: caseConflicts},
		{Name: "ConditionalSuccess", Run: caseConditionalSuccess},
		{Name: "DeleteAbsent", Run: caseDeleteAbsent},
		{Name: "InvalidBatches", Run: caseInvalidBatches},
		{Name: "ConcurrentCASCounter", Run: caseConcurrentCAS},
		{Name: "ConcurrentPutIfAbsent", Run: caseConcurrentPutIfAbsent},
		{Name: "ConcurrentWriters", Run: caseConcurrentWriters},
		{Name: "ReadYourWrites", Run: caseReadYourWrites},
		{Name: "Partitions", Run: casePartitions},
		{Name: "Size", Run: caseSize},
		{Name: "Reclaim", Run: caseReclaim},
		{Name: "Close", Run: caseClose},
	}
}

// Run runs every case as a subtest of t against stores made by open, which
// must return a fresh, empty store each time. The suite closes the stores.
func Run(t *testing.T, open func(t *testing.T) kv.Store) {
	t.Helper()
	RunConfig(t, Config{}, open)
}

// RunConfig is Run with an explicit Config.
func RunConfig(t *testing.T, cfg Config, open func(t *testing.T) kv.Store) {
	t.Helper()
	cfg = cfg.withDefaults()
	for _, c := range Cases(cfg) {
		t.Run(c.Name, func(t *testing.T) {
			s := open(t)
			defer closeQuietly(t, s)
			ctx, cancel := context.WithTimeout(t.Context(), cfg.CaseTimeout)
			defer cancel()
			c.Run(ctx, t, s)
		})
	}
}

// closeQuietly closes s after a case; a case may already have closed it, so
// ErrClosed is expected here and anything else is a failure.
func closeQuietly(t T, s kv.Store) {
	t.Helper()
	if err := s.Close(); err != nil && !errors.Is(err, kv.ErrClosed) {
		t.Errorf("Close after case: %v", err)
	}
}

// Result is the outcome of one case run by Verify.
type Result struct {
	Name   string
	Passed bool
	// Skipped is set when the case does not apply to the store (an
	// optional interface it does not implement); Passed is then true.
	Skipped  bool
	Duration time.Duration
	// Messages holds everything the case logged or reported, in order.
	Messages []string
}

// Verify runs every case outside `go test`, each against a fresh store from
// open, and returns one Result per case. It never panics because of a case:
// a panicking adaptor fails that case and the run goes on.
func Verify(ctx context.Context, cfg Config, open func(ctx context.Context) (kv.Store, error)) []Result {
	return VerifyCases(ctx, cfg, Cases(cfg), open)
}

// VerifyCases is Verify for a chosen subset of Cases, e.g. to rerun the
// failures of an earlier report.
func VerifyCases(ctx context.Context, cfg Config, cases []Case, open func(ctx context.Context) (kv.Store, error)) []Result {
	cfg = cfg.withDefaults()
	results := make([]Result, 0, len(cases))
	for _, c := range cases {
		results = append(results, verifyOne(ctx, cfg, c, open))
	}
	return results
}

func verifyOne(ctx context.Context, cfg Config, c Case, open func(ctx context.Context) (kv.Store, error)) Result {
	rt := &reportT{name: c.Name}
	start := time.Now()
	done := make(chan struct{})
	// The case runs on its own goroutine so that Fatalf can end it with
	// runtime.Goexit, exactly like testing.T.FailNow, without unwinding the
	// runner.
	go func() {
		defer close(done)
		defer func() {
			if p := recover(); p != nil {
				rt.Errorf("panic: %v", p)
			}
		}()
		s, err := open(ctx)
		if err != nil {
			rt.Fatalf("open store: %v", err)
		}
		defer closeQuietly(rt, s)
		cctx, cancel := context.WithTimeout(ctx, cfg.CaseTimeout)
		defer cancel()
		c.Run(cctx, rt, s)
	}()
	<-done
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return Result{Name: c.Name, Passed: !rt.failed, Skipped: rt.skipped && !rt.failed, Duration: time.Since(start), Messages: rt.msgs}
}

// reportT collects a case's messages for Verify. Cases call Errorf from
// helper goroutines, so it is safe for concurrent use.
type reportT struct {
	name    string
	mu      sync.Mutex
	failed  bool
	skipped bool
	msgs    []string
}

func (r *reportT) Helper()      {}
func (r *reportT) Name() string { return r.name }

func (r *reportT) Logf(format string, args ...any) { r.add(false, format, args) }

func (r *reportT) Errorf(format string, args ...any) { r.add(true, format, args) }

func (r *reportT) Fatalf(format string, args ...any) {
	r.add(true, format, args)
	runtime.Goexit()
}

func (r *reportT) Skipf(format string, args ...any) {
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	r.add(false, format, args)
	runtime.Goexit()
}

func (r *reportT) add(fail bool, format string, args []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fail {
		r.failed = true
	}
	r.msgs = append(r.msgs, strings.TrimSpace(fmt.Sprintf(format, args...)))
}
