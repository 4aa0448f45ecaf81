package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/engramkv/engram/cmd/engram/internal/config"
	"github.com/engramkv/engram/internal/proctest"
)

// wasmCache is the compilation cache the run's test processes share for
// the plugin at path (`make test` fills it before the race-detector tests,
// under which compiling is several times slower). The cache is keyed by the
// module's bytes, so sharing it changes no outcome: the pin checks compare
// the file's digest before anything is compiled.
func wasmCache(t *testing.T, path string) string {
	t.Helper()
	dir, err := proctest.WasmCacheDir(path)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// memkvWasm is the memkv test plugin built by `make plugins`.
func memkvWasm(t *testing.T) (path, digest string) {
	t.Helper()
	path, err := filepath.Abs("../../wasm/testplugins/bin/memkv.wasm")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (make plugins builds it)", err)
	}
	sum := sha256.Sum256(b)
	return path, hex.EncodeToString(sum[:])
}

func runPlugin(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut strings.Builder
	var cache string
	for _, a := range args {
		if strings.HasSuffix(a, ".wasm") {
			cache = wasmCache(t, a)
		}
	}
	code := run(append([]string{"plugin"}, append(args, "--cache-dir", cache)...), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestPluginInfoPrintsDigest(t *testing.T) {
	path, digest := memkvWasm(t)
	code, out, errOut := runPlugin(t, "info", path)
	if code != 0 {
		t.Fatalf("plugin info: exit %d, %s", code, errOut)
	}
	if !strings.Contains(out, "sha256:          "+digest+"\n") {
		t.Errorf("plugin info does not print the file's sha256 %s:\n%s", digest, out)
	}

	code, _, errOut = runPlugin(t, "info", path, "--sha256", "sha256:"+digest)
	if code != 0 {
		t.Errorf("plugin info with the right pin: exit %d, %s", code, errOut)
	}
	wrong := strings.Repeat("0", 64)
	code, _, errOut = runPlugin(t, "info", path, "--sha256", wrong)
	if code != 1 || !strings.Contains(errOut, digest) || !strings.Contains(errOut, wrong) {
		t.Errorf("plugin info with a wrong pin: exit %d, %q; want 1 and both digests", code, errOut)
	}
}

func TestPluginBench(t *testing.T) {
	path, digest := memkvWasm(t)
	js := filepath.Join(t.TempDir(), "bench.json")
	code, out, errOut := runPlugin(t, "bench", path, "--keys", "500", "--duration", "50ms", "--json", js)
	if code != 0 {
		t.Fatalf("plugin bench: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{digest, "memkv-wasm", "native memkv", "get ", "scan ", "commit "} {
		if !strings.Contains(out, want) {
			t.Errorf("plugin bench output lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var rep benchReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.SHA256 != digest || len(rep.Plugin) != 3 || len(rep.Native) != 3 {
		t.Fatalf("--json report: %+v", rep)
	}
	for i, r := range rep.Plugin {
		if r.Calls == 0 || r.Errors != 0 || r.P50 <= 0 || rep.Native[i].Calls == 0 {
			t.Errorf("result %d: plugin %+v, native %+v", i, r, rep.Native[i])
		}
	}

	code, _, errOut = runPlugin(t, "bench", path, "--clients", "0")
	if code != 2 || !strings.Contains(errOut, "clients") {
		t.Errorf("plugin bench --clients 0: exit %d, %q", code, errOut)
	}
}

// TestServeRefusesUnpinnedFile checks storage.wasm.sha256 end to end through
// openStore: the pinned file opens, any other file is refused with both
// digests named, and a malformed pin is refused by the configuration.
func TestServeRefusesUnpinnedFile(t *testing.T) {
	path, digest := memkvWasm(t)
	cfg := config.Default()
	cfg.Storage.Engine = config.EngineWasm
	cfg.Storage.Wasm.File = path
	cfg.Storage.Wasm.CacheDir = wasmCache(t, path)
	cfg.Storage.Wasm.SHA256 = digest
	logger := slog.New(slog.DiscardHandler)
	st, err := openStore(context.Background(), cfg, logger, nil)
	if err != nil {
		t.Fatalf("openStore with the right pin: %v", err)
	}
	_ = st.Close()

	wrong := strings.Repeat("ab", 32)
	cfg.Storage.Wasm.SHA256 = wrong
	if st, err := openStore(context.Background(), cfg, logger, nil); err == nil {
		_ = st.Close()
		t.Fatal("openStore with a wrong pin succeeded")
	} else if !strings.Contains(err.Error(), digest) || !strings.Contains(err.Error(), wrong) {
		t.Errorf("openStore with a wrong pin: %v; want both digests", err)
	}

	cfg.Storage.Wasm.SHA256 = "deadbeef"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "storage.wasm.sha256") {
		t.Errorf("Validate with a malformed pin: %v", err)
	}
}

// TestPluginVerifyChecksSpaceOps: memkv declares SIZE and RECLAIM, so
// verify says so and runs their cases. Every test plugin declares both; the
// skip path is checked by kvtest's TestVerifySkipsOptionalInterfaces.
func TestPluginVerifyChecksSpaceOps(t *testing.T) {
	path, _ := memkvWasm(t)
	code, out, errOut := runPlugin(t, "verify", path, "--run", "^(Size|Reclaim)$")
	if code != 0 {
		t.Fatalf("plugin verify: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		"Optional ops: SIZE declared, checked by case Size; RECLAIM declared, checked by case Reclaim",
		"PASS  Size", "PASS  Reclaim", "2 passed, 0 skipped, 0 failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("plugin verify output lacks %q:\n%s", want, out)
		}
	}
}
