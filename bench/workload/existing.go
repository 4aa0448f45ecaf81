package workload

import (
	"fmt"
	"math/rand/v2"
)

// Objects already in the store: the scale measurements of `make
// bench-scale` grow one server's data step by step (10k, 100k, 1M, 5M
// objects) and measure get and list against what is there, so the load
// workload must add only the difference and get and list must read the
// loaded objects instead of preloading a small data set of their own.
//
// The layout is deterministic from Prefix, PrefixObjects, KeySize and
// KeyOrder alone, so separate `engram bench` invocations agree on it: with
// PrefixObjects > 0, object i lives under the sub-prefix
// Prefix + "%03d/" of i/PrefixObjects (as kube-apiserver keeps each resource
// type under its own prefix), named by the load keyspace's key
// i%PrefixObjects; with PrefixObjects = 0 every object is the load
// keyspace's key i directly under Prefix.

// existingKey is the key of the i-th object of the load workload.
func (c *Config) existingKey(i int) string {
	return c.existingKeyspace(i).key(c.existingIndex(i))
}

// existingKeyspace is the keyspace holding object i.
func (c *Config) existingKeyspace(i int) keyspace {
	prefix := c.Prefix
	if c.PrefixObjects > 0 {
		prefix += fmt.Sprintf("%03d/", i/c.PrefixObjects)
	}
	return newKeyspace(prefix, Load, c.KeySize, c.KeyOrder)
}

// existingIndex is object i's index within its keyspace.
func (c *Config) existingIndex(i int) int {
	if c.PrefixObjects > 0 {
		return i % c.PrefixObjects
	}
	return i
}

// validateExisting checks the fields of this file; Existing needs an
// explicit prefix, since the default one is fresh and so empty.
func (c *Config) validateExisting() error {
	switch {
	case c.LoadFrom < 0 || c.LoadFrom >= c.DataSet:
		return fmt.Errorf("load from must be within 0..data set-1, got %d", c.LoadFrom)
	case c.PrefixObjects < 0:
		return fmt.Errorf("prefix objects must not be negative")
	case c.Existing && c.Prefix == "":
		return fmt.Errorf("existing needs the prefix the objects were loaded under")
	}
	return nil
}

// objectValue is a fresh random value of n bytes for one loaded object. The
// other workloads write one random value over and over, which is fine for
// timing; but objects that stay and are measured on disk must differ, or a
// store that compresses blocks (badger) stores a million copies of one
// value in the space of a few.
func objectValue(n int) string {
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := rand.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return string(b)
}
