//go:build !linux

package snapshot

import bolt "go.etcd.io/bbolt"

// releasePages is a no-op where the mapping's resident pages are not
// released explicitly (release_linux.go).
func releasePages(*bolt.DB, int64) {}
