//go:build !linux

package badger

// releaseTablePages is a no-op where table mappings are not released
// explicitly (release_linux.go).
func releaseTablePages(string) error { return nil }
