package proctest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// WasmCacheDir returns a wazero compilation cache directory for the plugin
// file at path, shared by every test process of a run and by later runs:
// os.TempDir()/engram-wasm-cache/NAME-HASH, HASH a prefix of the file's
// SHA-256. A plugin that links pgx takes 15-20 s to compile and a few
// hundred milliseconds to load from the cache, so the host's tests, the
// Kubernetes suite and `engram plugin verify` runs in one `make test` pay
// for one compilation. Caches of other builds of the same plugin (NAME-*)
// are removed: each is well over 100 MB.
func WasmCacheDir(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("wasm cache: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("wasm cache: hashing %s: %w", path, err)
	}
	name := strings.TrimSuffix(filepath.Base(path), ".wasm")
	root := filepath.Join(os.TempDir(), "engram-wasm-cache")
	dir := filepath.Join(root, name+"-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		stale, _ := filepath.Glob(filepath.Join(root, name+"-*"))
		for _, d := range stale {
			_ = os.RemoveAll(d)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("wasm cache: %w", err)
	}
	return dir, nil
}
