// Package host runs WebAssembly storage plugins (see wasm/abi/ABI.md) with wazero
// and serves them as a kv.Store, so the whole server runs on a plugin
// unchanged.
//
// It owns loading (compile once with wazero's compiler and a file
// compilation cache, validate exports, imports and the ABI version), the
// instance pool (sized by the plugin's instance model, one call in flight per
// instance, scans pinned to the instance that opened them), the host imports
// (log, clock, sockets restricted to an operator allow-list, with the
// request's deadline applied to every socket operation), failure handling
// (any trap, error or malformed response discards the instance; a pooled
// plugin gets a replacement, a single-instance plugin's store fails closed
// because its data died with the instance), the memory limit, logs and
// Prometheus metrics. The optional ops follow the manifest: a store is a
// kv.Sizer only when its plugin declares SIZE (a *SizedStore), and Reclaim
// sends RECLAIM only when declared, succeeding without work otherwise.
//
// It must not compile on a request path, must not trust anything a plugin
// returns (every length and pointer is checked, every body fully decoded
// before use), must not let a plugin crash or wedge the server through
// anything the host controls, and must not turn on wazero's
// close-on-context-done by default, because it costs every call a goroutine
// and the guest several times its CPU time (DESIGN.md, "Interrupting a
// spinning plugin"). Only Options.Untrusted turns it on, for plugins that
// may spin without calling the host, which nothing else can stop: a wasm
// guest spinning in compiled code cannot be preempted, and it even blocks
// the Go garbage collector's stop-the-world, hanging the whole process.
package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/engramkv/engram/wasm/abi"
)

// SupportedMajors are the ABI majors this host implements.
var SupportedMajors = []int32{abi.Major}

// DefaultMemoryLimit is the per-instance linear memory cap when
// Options.MemoryLimit is 0.
const DefaultMemoryLimit = 256 << 20

const wasmPage = 64 << 10

// Options configure how a plugin is loaded: the runtime shared by all its
// instances.
type Options struct {
	// Logger receives load messages, guest stderr/stdout and log imports;
	// nil discards.
	Logger *slog.Logger
	// Registerer receives the plugin's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// CacheDir holds wazero's compilation cache, so a restart loads a
	// compiled plugin in milliseconds instead of compiling for seconds;
	// empty compiles without a file cache.
	CacheDir string
	// MemoryLimit caps each instance's linear memory, in bytes (rounded up
	// to 64 KiB pages); 0 means DefaultMemoryLimit. A guest growing past it
	// traps and is replaced.
	MemoryLimit int64
	// Untrusted compiles the plugin with wazero's interruption checks
	// (close on context done), so a call spinning in guest code without
	// host calls is stopped at its deadline. It costs guest CPU time and a
	// goroutine per call (DESIGN.md, "Interrupting a spinning plugin"); off
	// by default.
	Untrusted bool
	// SHA256 pins the plugin file: when set (64 hex digits, optionally
	// prefixed "sha256:"), Load refuses a file whose SHA-256 differs,
	// with an error naming both digests. The digest is computed over the
	// very bytes that are then compiled, so a file replaced between the
	// check and the compilation cannot slip through.
	SHA256 string
}

// Plugin is a compiled plugin: the runtime, the compiled module and the host
// imports. Open starts stores on it; all stores share the compiled code.
type Plugin struct {
	name     string // file base name, for messages before the manifest is known
	path     string
	digest   string // hex SHA-256 of the compiled bytes
	opts     Options
	log      *slog.Logger
	rt       wazero.Runtime
	compiled wazero.CompiledModule
	metrics  *metrics
}

// Load reads, compiles and validates a plugin file. It returns an error
// naming the problem for a file that is not WebAssembly, misses an export,
// has a wrong export signature, imports something this host does not
// provide, or implements an ABI major this host does not support.
func Load(ctx context.Context, path string, opts Options) (*Plugin, error) {
	name := filepath.Base(path)
	bin, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("wasm plugin: %w", err)
	}
	digest := Digest(bin)
	if opts.SHA256 != "" {
		want, err := ParseDigest(opts.SHA256)
		if err != nil {
			return nil, fmt.Errorf("wasm plugin %s: pinned digest: %w", name, err)
		}
		if want != digest {
			return nil, fmt.Errorf("wasm plugin %s: the file's sha256 is %s but the pinned sha256 is %s: "+
				"it is not the file that was pinned; refusing to load it", path, digest, want)
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("plugin", name)
	limit := opts.MemoryLimit
	if limit <= 0 {
		limit = DefaultMemoryLimit
	}
	pages := (limit + wasmPage - 1) / wasmPage
	if pages > 65536 {
		return nil, fmt.Errorf("wasm plugin %s: memory limit %d bytes exceeds the 4 GiB a wasm32 memory can have", name, limit)
	}
	rc := wazero.NewRuntimeConfigCompiler().
		WithMemoryLimitPages(uint32(pages)).
		WithCloseOnContextDone(opts.Untrusted)
	if opts.CacheDir != "" {
		dir, err := cacheDirFor(opts.CacheDir, digest, log)
		if err != nil {
			return nil, fmt.Errorf("wasm plugin %s: compilation cache: %w", name, err)
		}
		cache, err := wazero.NewCompilationCacheWithDir(dir)
		if err != nil {
			return nil, fmt.Errorf("wasm plugin %s: compilation cache %s: %w", name, dir, err)
		}
		rc = rc.WithCompilationCache(cache)
	}
	p := &Plugin{name: name, path: path, digest: digest, opts: opts, log: log}
	p.rt = wazero.NewRuntimeWithConfig(ctx, rc)
	ok := false
	defer func() {
		if !ok {
			_ = p.rt.Close(context.Background())
		}
	}()
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, p.rt); err != nil {
		return nil, fmt.Errorf("wasm plugin %s: wasi: %w", name, err)
	}
	if err := instantiateHostModule(ctx, p.rt); err != nil {
		return nil, fmt.Errorf("wasm plugin %s: host module: %w", name, err)
	}
	start := time.Now()
	p.compiled, err = p.rt.CompileModule(ctx, bin)
	if err != nil {
		return nil, fmt.Errorf("wasm plugin %s: not a valid WebAssembly module: %w", name, err)
	}
	log.Info("compiled wasm plugin", "bytes", len(bin), "sha256", digest, "took", time.Since(start).Round(time.Millisecond),
		"cache", opts.CacheDir != "", "untrusted", opts.Untrusted)
	if err := validate(name, p.compiled); err != nil {
		return nil, err
	}
	p.metrics = newMetrics(opts.Registerer)
	// Instantiate once to check the version export: a wrong major is
	// refused at load, not on the first request.
	in, err := p.newInstance(ctx, nil, 0)
	if err != nil {
		return nil, err
	}
	in.discard()
	ok = true
	return p, nil
}

// Close releases the runtime and the compiled code. Stores opened on the
// plugin must be closed first.
func (p *Plugin) Close(ctx context.Context) error {
	return p.rt.Close(ctx)
}

// Name is the plugin file's base name.
func (p *Plugin) Name() string { return p.name }

// Digest is the hex SHA-256 of the file's bytes as they were compiled: the
// value to pin with Options.SHA256 (storage.wasm.sha256).
func (p *Plugin) Digest() string { return p.digest }

// signature is an export's expected parameter and result types.
type signature struct {
	params, results []api.ValueType
}

var requiredExports = map[string]signature{
	abi.ExportVersion:  {nil, []api.ValueType{api.ValueTypeI32}},
	abi.ExportBuffer:   {[]api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}},
	abi.ExportDispatch: {[]api.ValueType{api.ValueTypeI32, api.ValueTypeI32}, []api.ValueType{api.ValueTypeI64}},
}

// validate checks the module's exports and imports against ABI.md, so a
// wrong file fails at load with a message that names the problem.
func validate(name string, cm wazero.CompiledModule) error {
	var errs []error
	exports := cm.ExportedFunctions()
	for _, exp := range []string{abi.ExportVersion, abi.ExportBuffer, abi.ExportDispatch} {
		want := requiredExports[exp]
		def, ok := exports[exp]
		if !ok {
			errs = append(errs, fmt.Errorf("missing export %s (is it a plugin built with the Engram SDK, as a reactor?)", exp))
			continue
		}
		if !sameTypes(def.ParamTypes(), want.params) || !sameTypes(def.ResultTypes(), want.results) {
			errs = append(errs, fmt.Errorf("export %s has signature %s, want %s", exp,
				sigString(def.ParamTypes(), def.ResultTypes()), sigString(want.params, want.results)))
		}
	}
	if _, ok := cm.ExportedMemories()[abi.ExportMemory]; !ok {
		errs = append(errs, fmt.Errorf("missing export %s", abi.ExportMemory))
	}
	if _, ok := exports["_start"]; ok {
		if _, ok := exports[abi.ExportInitialize]; !ok {
			errs = append(errs, errors.New("the module is a WASI command (_start), not a reactor (_initialize); build with -buildmode=c-shared"))
		}
	}
	for _, imp := range cm.ImportedFunctions() {
		mod, fn, _ := imp.Import()
		switch mod {
		case wasi_snapshot_preview1.ModuleName:
		case abi.HostModule:
			if _, ok := hostFunctions[fn]; !ok {
				errs = append(errs, fmt.Errorf("imports %s.%s, which this host does not provide", mod, fn))
			}
		default:
			errs = append(errs, fmt.Errorf("imports %s.%s: module %q is not provided by this host (it provides %s and %s; a newer ABI?)",
				mod, fn, mod, wasi_snapshot_preview1.ModuleName, abi.HostModule))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("wasm plugin %s is not a valid Engram plugin: %w", name, errors.Join(errs...))
	}
	return nil
}

func sameTypes(a, b []api.ValueType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func sigString(params, results []api.ValueType) string {
	s := "("
	for i, t := range params {
		if i > 0 {
			s += ", "
		}
		s += api.ValueTypeName(t)
	}
	s += ") -> ("
	for i, t := range results {
		if i > 0 {
			s += ", "
		}
		s += api.ValueTypeName(t)
	}
	return s + ")"
}
