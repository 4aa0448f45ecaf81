package badger

import (
	"testing"

	"github.com/engramkv/engram/engines/internal/enginetest"
)

// TestConditionsAfterCachedWrites runs conditions through the store with the
// condition cache on (package condcache).
func TestConditionsAfterCachedWrites(t *testing.T) {
	s := openDisk(t, t.TempDir())
	defer s.Close()
	enginetest.ConditionsAfterWrites(t, s)
}
