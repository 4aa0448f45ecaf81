package workload

import (
	"strings"
	"testing"
	"time"
)

func TestKeyspace(t *testing.T) {
	for _, order := range []string{KeyOrderSequential, KeyOrderRandom} {
		ks := newKeyspace("/bench/abc/", "get", 70, order)
		seen := map[string]bool{}
		ascending := 0
		prev := ""
		for i := range 10_000 {
			k := ks.key(i)
			if len(k) != 70 {
				t.Fatalf("%s: key %d is %d bytes, want 70", order, i, len(k))
			}
			if !strings.HasPrefix(k, ks.base) || k >= ks.end() {
				t.Fatalf("%s: key %q outside [%q, %q)", order, k, ks.base, ks.end())
			}
			if seen[k] {
				t.Fatalf("%s: key %d repeats %q", order, i, k)
			}
			seen[k] = true
			if k > prev {
				ascending++
			}
			prev = k
		}
		switch order {
		case KeyOrderSequential:
			if ascending != 10_000 {
				t.Errorf("sequential: %d of 10000 keys follow their predecessor, want all", ascending)
			}
		case KeyOrderRandom:
			// A random order puts about half the keys after their
			// predecessor; creation order must not be key order.
			if ascending < 4500 || ascending > 5500 {
				t.Errorf("random: %d of 10000 keys follow their predecessor, want about half", ascending)
			}
		}
		// A prefix longer than the key size makes longer keys, never equal ones.
		long := newKeyspace(strings.Repeat("p", 80), "get", 70, order)
		if long.key(1) == long.key(2) {
			t.Errorf("%s: keys collide when the prefix exceeds the key size", order)
		}
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
