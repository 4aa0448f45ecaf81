package host

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/engramkv/engram/internal/proctest"
)

// copyFile copies a plugin to dst, replacing what is there.
func copyFile(t *testing.T, src, dst string) []byte {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPinnedDigest(t *testing.T) {
	ctx := context.Background()
	bin, err := os.ReadFile(pluginPath(t, "memkv"))
	if err != nil {
		t.Fatal(err)
	}
	digest := Digest(bin)
	faulty, err := os.ReadFile(pluginPath(t, "faulty"))
	if err != nil {
		t.Fatal(err)
	}
	other := Digest(faulty)
	// The run's shared cache (loadPlugin's): the pin is checked before
	// anything is compiled, and compiling under the race detector again
	// would cost this test ten seconds for nothing it checks.
	cache, err := proctest.WasmCacheDir(pluginPath(t, "memkv"))
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{CacheDir: cache, Logger: testLogger(t)}

	for _, pin := range []string{digest, strings.ToUpper(digest), "sha256:" + digest, " " + digest + "\n"} {
		opts.SHA256 = pin
		p, err := Load(ctx, pluginPath(t, "memkv"), opts)
		if err != nil {
			t.Fatalf("Load pinned to %q: %v", pin, err)
		}
		if p.Digest() != digest {
			t.Errorf("Digest() = %s, want %s", p.Digest(), digest)
		}
		_ = p.Close(ctx)
	}

	opts.SHA256 = other
	_, err = Load(ctx, pluginPath(t, "memkv"), opts)
	if err == nil {
		t.Fatal("Load of memkv.wasm pinned to faulty.wasm's digest succeeded")
	}
	for _, want := range []string{digest, other, "memkv.wasm", "pinned"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("mismatch error %q does not contain %q", err, want)
		}
	}

	for _, bad := range []string{"abc", digest[:63] + "g", digest + "00", "md5:" + digest} {
		opts.SHA256 = bad
		if _, err := Load(ctx, pluginPath(t, "memkv"), opts); err == nil || !strings.Contains(err.Error(), "not a SHA-256 digest") {
			t.Errorf("Load pinned to %q: err = %v, want a malformed-digest error", bad, err)
		}
	}
}

// TestCacheNeverRunsAStaleEntry replaces a plugin file in place, as an
// upgrade does, and checks that the next load runs the new code, not the
// compiled code of the old file that is still in the cache.
func TestCacheNeverRunsAStaleEntry(t *testing.T) {
	ctx := context.Background()
	cache := t.TempDir()
	file := filepath.Join(t.TempDir(), "storage.wasm")
	opts := Options{CacheDir: cache, Logger: testLogger(t)}

	first := copyFile(t, pluginPath(t, "memkv"), file)
	p, err := Load(ctx, file, opts)
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.Open(ctx, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Manifest().Name; got != "memkv-wasm" {
		t.Fatalf("first file's engine = %q, want memkv-wasm", got)
	}
	_ = s.Close()
	_ = p.Close(ctx)

	second := copyFile(t, pluginPath(t, "faulty"), file)
	p, err = Load(ctx, file, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	if p.Digest() != Digest(second) {
		t.Errorf("Digest() = %s, want the new file's %s", p.Digest(), Digest(second))
	}
	// faulty refuses an empty config; memkv accepts it. The refusal proves
	// the new file's code runs.
	s, err = p.Open(ctx, StoreOptions{})
	if err == nil {
		_ = s.Close()
		t.Fatal("the replaced file opened like the old one: it ran from the old file's cache entry")
	}
	if !strings.Contains(err.Error(), "addr=HOST:PORT is required") {
		t.Errorf("Open of the new file: %v, want faulty's refusal of an empty config", err)
	}

	// Each file's machine code lives under its own digest.
	for _, b := range [][]byte{first, second} {
		entries, err := os.ReadDir(filepath.Join(cache, cachePrefix+Digest(b)))
		if err != nil || len(entries) == 0 {
			t.Errorf("cache directory of digest %s: %d entries, err %v", Digest(b)[:12], len(entries), err)
		}
	}
}

// TestCachePrunesUnusedEntries checks that loading a plugin removes cache
// entries of other files unused for longer than cacheKeep, and keeps
// recently used ones.
func TestCachePrunesUnusedEntries(t *testing.T) {
	cache := t.TempDir()
	old := filepath.Join(cache, cachePrefix+strings.Repeat("a", 64))
	recent := filepath.Join(cache, cachePrefix+strings.Repeat("b", 64))
	unrelated := filepath.Join(cache, "not-engram")
	for _, d := range []string{old, recent, unrelated} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "entry"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-cacheKeep - time.Hour)
	for _, d := range []string{old, unrelated} {
		if err := os.Chtimes(d, long, long); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := cacheDirFor(cache, strings.Repeat("c", 64), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("the plugin's own cache directory: %v", err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("an entry unused for longer than %v was kept (stat: %v)", cacheKeep, err)
	}
	for _, d := range []string{recent, unrelated} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", filepath.Base(d), err)
		}
	}
}
