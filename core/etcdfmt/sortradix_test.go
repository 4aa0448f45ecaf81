package etcdfmt

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestRadixSort checks the radix sort against a comparison sort on numbers
// that vary in every byte, in a few bytes, or not at all, with many equal
// ones (the ties it must report) and negative revisions.
func TestRadixSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	numbers := map[string]func() uint64{
		"any":      rng.Uint64,
		"low byte": func() uint64 { return rng.Uint64N(256) },
		"few":      func() uint64 { return []uint64{0, 1 << 40, 1<<63 + 5}[rng.IntN(3)] },
		"one":      func() uint64 { return 42 },
	}
	var r radixScratch
	for name, number := range numbers {
		for _, n := range []int{0, 1, 2, 1000} {
			t.Run(fmt.Sprint(name, "/", n), func(t *testing.T) {
				items := make([]sortItem, n)
				for i := range items {
					it := &items[i]
					it.head = [2]uint64{number(), number()}
					it.rev = Revision{Main: int64(number()), Sub: int64(i)}
				}
				byHead := func(a, b sortItem) int {
					return cmp.Or(cmp.Compare(a.head[0], b.head[0]), cmp.Compare(a.head[1], b.head[1]))
				}
				want := slices.Clone(items)
				slices.SortStableFunc(want, byHead)
				got := slices.Clone(items)
				ties := radixSort(got, &r, func(it *sortItem) (uint64, uint64) { return it.head[0], it.head[1] })
				if !slices.Equal(got, want) {
					t.Fatal("radix order differs from a stable comparison sort's")
				}
				var wantTies [][2]int
				for i := 0; i < n; {
					j := i + 1
					for j < n && got[j].head == got[i].head {
						j++
					}
					if j-i > 1 {
						wantTies = append(wantTies, [2]int{i, j})
					}
					i = j
				}
				if !slices.Equal(ties, wantTies) {
					t.Fatalf("ties %v, want %v", ties, wantTies)
				}

				byRev := slices.Clone(items)
				sortByRevision(byRev, &r)
				if !slices.IsSortedFunc(byRev, func(a, b sortItem) int {
					return cmp.Or(cmp.Compare(a.rev.Main, b.rev.Main), cmp.Compare(a.rev.Sub, b.rev.Sub))
				}) {
					t.Fatal("sortByRevision left revisions out of order")
				}
			})
		}
	}
}
