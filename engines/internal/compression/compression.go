// Package compression is the choice of table compression the engines that
// compress (badger, pebble) offer under the same names. It maps a name to
// the engine's own setting; it must not know any engine's types.
package compression

import (
	"fmt"
	"strings"
)

// Names are the values an engine's Options.Compression takes.
var Names = []string{"none", "snappy", "zstd"}

// Choose returns the engine's setting for name: none (also for an empty
// name), snappy or zstd.
func Choose[T any](name string, none, snappy, zstd T) (T, error) {
	switch name {
	case "", "none":
		return none, nil
	case "snappy":
		return snappy, nil
	case "zstd":
		return zstd, nil
	}
	var zero T
	return zero, fmt.Errorf("unknown compression %q (want one of %s)", name, strings.Join(Names, ", "))
}
