package etcdfmt

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// randomEntries returns n entries with revisions 1..n/2 (sub 0 or 1) in
// random order and values of random size up to maxValue.
func randomEntries(rng *rand.Rand, n, maxValue int) []Entry {
	es := make([]Entry, n)
	for i := range es {
		e := &es[i]
		e.Rev = Revision{Main: int64(i/2 + 1), Sub: int64(i % 2)}
		e.Tombstone = rng.IntN(5) == 0
		e.Latest = rng.IntN(3) == 0
		e.KV.Key = fmt.Appendf(nil, "/registry/key/%d", rng.IntN(n))
		e.KV.ModRevision = e.Rev.Main
		if !e.Tombstone {
			e.KV.CreateRevision = rng.Int64N(e.Rev.Main) + 1
			e.KV.Version = rng.Int64N(100) + 1
			e.KV.Lease = rng.Int64() - rng.Int64()
			if v := rng.IntN(maxValue + 1); v > 0 {
				e.KV.Value = make([]byte, v)
				for j := range e.KV.Value {
					e.KV.Value[j] = byte(rng.Uint32())
				}
			}
		}
	}
	rng.Shuffle(len(es), func(i, j int) { es[i], es[j] = es[j], es[i] })
	return es
}

func entriesEqual(a, b *Entry) bool {
	return a.Rev == b.Rev && a.Tombstone == b.Tombstone && a.Latest == b.Latest &&
		bytes.Equal(a.KV.Key, b.KV.Key) && bytes.Equal(a.KV.Value, b.KV.Value) &&
		a.KV.CreateRevision == b.KV.CreateRevision && a.KV.ModRevision == b.KV.ModRevision &&
		a.KV.Version == b.KV.Version && a.KV.Lease == b.KV.Lease
}

// addAll adds es through one reused Entry, as callers reusing buffers do,
// so a sorter that kept references instead of copies would fail.
func addAll(t testing.TB, s *Sorter, es []Entry) {
	t.Helper()
	var e Entry
	for i := range es {
		e = es[i]
		e.KV.Key = append([]byte(nil), es[i].KV.Key...)
		e.KV.Value = append([]byte(nil), es[i].KV.Value...)
		if err := s.Add(&e); err != nil {
			t.Fatal(err)
		}
		clear(e.KV.Key)
		clear(e.KV.Value)
	}
}

func runFiles(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func TestSorterOrder(t *testing.T) {
	for _, tc := range []struct {
		name     string
		n        int
		memLimit int
		spills   bool
	}{
		{"empty", 0, 1 << 10, false},
		{"in memory", 500, 1 << 20, false},
		{"several runs", 2000, 16 << 10, true},
		{"one row per run", 50, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tc.n)))
			es := randomEntries(rng, tc.n, 300)
			dir := t.TempDir()
			s := NewSorter(dir, tc.memLimit)
			defer s.Close()
			addAll(t, s, es)
			if got := s.Len(); got != int64(tc.n) {
				t.Fatalf("Len = %d, want %d", got, tc.n)
			}
			if files := runFiles(t, dir); (len(files) > 0) != tc.spills {
				t.Fatalf("run files %v, want spilling %v", files, tc.spills)
			}
			want := make(map[Revision]*Entry, len(es))
			for i := range es {
				want[es[i].Rev] = &es[i]
			}
			// Twice: Each may be repeated.
			for range 2 {
				var prev Revision
				n := 0
				err := s.Each(t.Context(), func(e *Entry) error {
					if n > 0 && !prev.Less(e.Rev) {
						return fmt.Errorf("row %d: revision %v after %v", n, e.Rev, prev)
					}
					if w := want[e.Rev]; w == nil || !entriesEqual(e, w) {
						return fmt.Errorf("row %d: got %+v, want %+v", n, e, w)
					}
					prev = e.Rev
					n++
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if n != tc.n {
					t.Fatalf("Each gave %d rows, want %d", n, tc.n)
				}
			}
			if err := s.Add(&Entry{Rev: Revision{Main: 1}}); err == nil {
				t.Fatal("Add after Each succeeded")
			}
		})
	}
}

func TestSorterDuplicate(t *testing.T) {
	for _, memLimit := range []int{1 << 20, 1} { // duplicates within a batch and across runs
		t.Run(fmt.Sprint(memLimit), func(t *testing.T) {
			s := NewSorter(t.TempDir(), memLimit)
			defer s.Close()
			for i, k := range []string{"a", "b", "c", "d"} {
				rev := Revision{Main: int64(i + 1)}
				if k == "c" {
					rev = Revision{Main: 2}
				}
				e := Entry{Rev: rev, KV: keyValue(k, rev.Main)}
				if err := s.Add(&e); err != nil {
					t.Fatal(err)
				}
			}
			err := s.Each(t.Context(), func(*Entry) error { return nil })
			if err == nil {
				t.Fatal("duplicate revision not reported")
			}
			for _, want := range []string{"2/0", `"b"`, `"c"`} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %s", err, want)
				}
			}
		})
	}
}

func TestSorterCloseRemovesRuns(t *testing.T) {
	dir := t.TempDir()
	s := NewSorter(dir, 1<<10)
	addAll(t, s, randomEntries(rand.New(rand.NewPCG(2, 2)), 200, 100))
	if len(runFiles(t, dir)) == 0 {
		t.Fatal("no run file written")
	}
	errStop := errors.New("stop")
	if err := s.Each(t.Context(), func(*Entry) error { return errStop }); !errors.Is(err, errStop) {
		t.Fatalf("Each = %v, want %v", err, errStop)
	}
	for range 2 {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if files := runFiles(t, dir); len(files) > 0 {
			t.Fatalf("files left after Close: %v", files)
		}
	}
}

func TestSorterContext(t *testing.T) {
	s := NewSorter(t.TempDir(), 1<<10)
	defer s.Close()
	addAll(t, s, randomEntries(rand.New(rand.NewPCG(3, 3)), 100, 100))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.Each(ctx, func(*Entry) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Each = %v, want %v", err, context.Canceled)
	}
}

func keyValue(k string, rev int64) (kv KeyValue) {
	kv.Key, kv.ModRevision, kv.CreateRevision, kv.Version = []byte(k), rev, rev, 1
	return kv
}

// BenchmarkSorter sorts a million rows with 512-byte values in revision
// order reversed (the worst case for runs: every run overlaps every other)
// under the default memory limit. -short sorts 10,000.
func BenchmarkSorter(b *testing.B) {
	n := 1_000_000
	if testing.Short() {
		n = 10_000
	}
	value := bytes.Repeat([]byte("v"), 512)
	key := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		s := NewSorter(b.TempDir(), 0)
		var e Entry
		for i := range n {
			rev := int64(n - i)
			key = strconv.AppendInt(append(key[:0], "/registry/pods/default/pod-"...), rev, 10)
			e = Entry{Rev: Revision{Main: rev}, Latest: true, KV: KeyValue{Key: key, Value: value, ModRevision: rev, CreateRevision: rev, Version: 1}}
			if err := s.Add(&e); err != nil {
				b.Fatal(err)
			}
		}
		rows := 0
		if err := s.Each(b.Context(), func(*Entry) error { rows++; return nil }); err != nil {
			b.Fatal(err)
		}
		if rows != n {
			b.Fatalf("%d rows, want %d", rows, n)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n), "rows/op")
}

// TestKeySorterOrder sorts keys that defeat a comparison of key heads:
// long shared prefixes, keys that are prefixes of others, zero bytes
// (which the heads' padding also holds) and keys differing only past 16
// bytes, in memory and through runs; the order must be bytes.Compare's,
// then the revisions'.
func TestKeySorterOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	alphabet := []byte{0, 1, 'a', 'b', 0xff}
	var es []Entry
	for i := range 3000 {
		key := []byte("/registry/pods/")
		for range rng.IntN(24) {
			key = append(key, alphabet[rng.IntN(len(alphabet))])
		}
		e := Entry{Rev: Revision{Main: int64(i + 2)}, KV: keyValue(string(key), int64(i+2))}
		es = append(es, e)
		if rng.IntN(4) == 0 { // the same key again, later
			es = append(es, Entry{Rev: Revision{Main: e.Rev.Main, Sub: 1}, KV: keyValue(string(key), e.Rev.Main)})
		}
	}
	want := slices.Clone(es)
	slices.SortFunc(want, func(a, b Entry) int {
		if c := bytes.Compare(a.KV.Key, b.KV.Key); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Rev.Main, b.Rev.Main); c != 0 {
			return c
		}
		return cmp.Compare(a.Rev.Sub, b.Rev.Sub)
	})
	for _, memLimit := range []int{1 << 20, 8 << 10} {
		t.Run(fmt.Sprint(memLimit), func(t *testing.T) {
			rng.Shuffle(len(es), func(i, j int) { es[i], es[j] = es[j], es[i] })
			s := NewKeySorter(t.TempDir(), memLimit)
			defer s.Close()
			addAll(t, s, es)
			i := 0
			err := s.Each(t.Context(), func(e *Entry) error {
				if w := &want[i]; !bytes.Equal(e.KV.Key, w.KV.Key) || e.Rev != w.Rev {
					return fmt.Errorf("row %d: %q at %v, want %q at %v", i, e.KV.Key, e.Rev, w.KV.Key, w.Rev)
				}
				i++
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if i != len(want) {
				t.Fatalf("Each gave %d rows, want %d", i, len(want))
			}
		})
	}
}
