package workload

import (
	"strings"
	"testing"
	"time"
)

func TestKeyspace(t *testing.T) {
	ks := newKeyspace("/bench/abc/", "get", 70)
	k1, k2 := ks.key(1), ks.key(10)
	if len(k1) != 70 || len(k2) != 70 {
		t.Errorf("key sizes %d, %d", len(k1), len(k2))
	}
	if k1 >= k2 {
		t.Errorf("keys not in index order: %q >= %q", k1, k2)
	}
	if !strings.HasPrefix(k1, ks.base) || k1 >= ks.end() || ks.base >= ks.end() {
		t.Errorf("key %q outside [%q, %q)", k1, ks.base, ks.end())
	}
	// A prefix longer than the key size makes longer keys, never equal ones.
	long := newKeyspace(strings.Repeat("p", 80), "get", 70)
	if long.key(1) == long.key(2) {
		t.Error("keys collide when the prefix exceeds the key size")
	}
}

func TestProgressLine(t *testing.T) {
	line := progressLine("create", 5*time.Second, 10*time.Second, 5000, 2)
	for _, want := range []string{"create", "##########----------", "5000 ops", "1000.0/s", "2 err"} {
		if !strings.Contains(line, want) {
			t.Errorf("progress line %q lacks %q", line, want)
		}
	}
}
