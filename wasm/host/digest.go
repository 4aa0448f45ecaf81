package host

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A plugin file is identified by the SHA-256 of its bytes. Operators pin it
// (storage.wasm.sha256) so that the file Engram runs is the file they
// reviewed, and the compilation cache is partitioned by it, so that compiled
// code is only ever reused for the exact bytes it was compiled from.

// Digest returns the hex SHA-256 of a plugin file's bytes, as printed by
// sha256sum and `engram plugin info`.
func Digest(bin []byte) string {
	sum := sha256.Sum256(bin)
	return hex.EncodeToString(sum[:])
}

// ParseDigest normalises a pinned digest: 64 hex digits in either case,
// optionally prefixed "sha256:" (the form OCI registries print). It returns
// the lower-case hex form Digest produces.
func ParseDigest(s string) (string, error) {
	d := strings.TrimSpace(s)
	d = strings.TrimPrefix(strings.ToLower(d), "sha256:")
	if len(d) != 2*sha256.Size {
		return "", fmt.Errorf("%q is not a SHA-256 digest: want 64 hex digits (as sha256sum prints), got %d characters", s, len(d))
	}
	if _, err := hex.DecodeString(d); err != nil {
		return "", fmt.Errorf("%q is not a SHA-256 digest: %v", s, err)
	}
	return d, nil
}

// cacheKeep is how long a compilation cache entry of another plugin file
// is kept after it was last used. Each entry holds a whole plugin's machine
// code (well over 100 MB for one that links a database driver), and wazero
// never evicts, so without pruning every upgrade would leave one behind.
const cacheKeep = 7 * 24 * time.Hour

// cachePrefix names the per-file directories under a cache root.
const cachePrefix = "sha256-"

// cacheDirFor returns the compilation cache directory of the file with the
// given digest under root, creating it, and removes sibling directories of
// other files unused for cacheKeep.
//
// Why a directory per digest when wazero already keys its entries by a hash
// of the module's bytes: the guarantee that a changed file never runs from a
// stale entry then rests on Engram's own layout, visible in the file system
// and independent of wazero's internal key; and the entries of files that
// are no longer deployed can be found and removed. Using a directory marks
// it as used now (its modification time), so a plugin loaded daily is never
// pruned, whichever process shares the root.
func cacheDirFor(root, digest string, log *slog.Logger) (string, error) {
	dir := filepath.Join(root, cachePrefix+digest)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	now := time.Now()
	if err := os.Chtimes(dir, now, now); err != nil {
		return "", err
	}
	stale, err := filepath.Glob(filepath.Join(root, cachePrefix+"*"))
	if err != nil {
		return dir, nil
	}
	for _, d := range stale {
		if d == dir {
			continue
		}
		st, err := os.Stat(d)
		if err != nil || !st.IsDir() || now.Sub(st.ModTime()) < cacheKeep {
			continue
		}
		// Another process compiling into d right now would have marked
		// it used: an entry older than cacheKeep belongs to nobody.
		if err := os.RemoveAll(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("could not remove an unused wasm compilation cache entry", "dir", d, "err", err)
			continue
		}
		log.Info("removed an unused wasm compilation cache entry", "dir", d, "unused-for", now.Sub(st.ModTime()).Round(time.Hour))
	}
	return dir, nil
}
