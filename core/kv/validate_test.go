package kv

import (
	"fmt"
	"strings"
	"testing"
)

// TestValidateBatchDuplicates covers both ways checkDistinctKeys looks for
// a key named twice: pairwise in small batches, sorted in large ones, with
// the duplicate first, last and apart in each.
func TestValidateBatchDuplicates(t *testing.T) {
	batch := func(n int) []Op {
		ops := make([]Op, n)
		for i := range ops {
			ops[i] = Put([]byte(fmt.Sprintf("k%04d", n-i)), nil) // descending: sorting must move every key
		}
		return ops
	}
	for _, n := range []int{1, 2, pairwiseKeysUpTo, pairwiseKeysUpTo + 1, 500} {
		if err := ValidateBatch(batch(n)); err != nil {
			t.Errorf("%d distinct keys: %v", n, err)
		}
		if n < 2 {
			continue
		}
		for _, at := range [][2]int{{0, n - 1}, {0, 1}, {n - 2, n - 1}, {n / 2, n / 3}} {
			if at[0] == at[1] {
				continue
			}
			ops := batch(n)
			ops[at[1]].Key = ops[at[0]].Key
			err := ValidateBatch(ops)
			want := fmt.Sprintf("op %d: key %q appears twice", max(at[0], at[1]), ops[at[0]].Key)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%d keys, ops %d and %d the same: %v, want %q", n, at[0], at[1], err, want)
			}
		}
	}
}

func BenchmarkValidateBatch(b *testing.B) {
	for _, n := range []int{3, 300} {
		ops := make([]Op, n)
		for i := range ops {
			ops[i] = Put([]byte(fmt.Sprintf("/registry/pods/default/pod-%06d", i*7919%n)), nil)
		}
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := ValidateBatch(ops); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
