package main

import (
	"path/filepath"
	"testing"
)

// TestRestoreTempDir: the sort files go into data-dir when it exists, and
// to the system's temporary directory when the engine keeps no files there
// (a restore into TiKV failed at its first spill).
func TestRestoreTempDir(t *testing.T) {
	dir := t.TempDir()
	if got := restoreTempDir(dir); got != dir {
		t.Errorf("restoreTempDir(%q) = %q, want it", dir, got)
	}
	missing := filepath.Join(dir, "missing")
	if got := restoreTempDir(missing); got != "" {
		t.Errorf("restoreTempDir(%q) = %q, want \"\"", missing, got)
	}
}
