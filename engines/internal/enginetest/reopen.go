package enginetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/internal/diskuse"
)

// DeleteRevisions deletes keys from..to-1 of WriteRevisions in batches of
// 5000, as a compaction of history does.
func DeleteRevisions(tb testing.TB, s kv.Store, from, to int) {
	tb.Helper()
	for i := from; i < to; i += 5000 {
		var ops []kv.Op
		for j := i; j < min(i+5000, to); j++ {
			ops = append(ops, kv.Delete(RevKey(j)))
		}
		if err := s.Commit(context.Background(), ops); err != nil {
			tb.Fatal(err)
		}
	}
}

// RevBytes is what n keys of WriteRevisions hold, keys and values.
func RevBytes(n int) int64 { return int64(n * (len(RevKey(0)) + 512)) }

// CheckRevisions checks, at both ends of each range, that keys 0..live-1
// of WriteRevisions read and keys live..total-1 are gone.
func CheckRevisions(t *testing.T, s kv.Store, live, total int) {
	t.Helper()
	ctx := context.Background()
	for _, i := range []int{0, live - 1} {
		if _, err := s.Get(ctx, RevKey(i)); err != nil {
			t.Errorf("live key %d: %v", i, err)
		}
	}
	for _, i := range []int{live, total - 1} {
		if _, err := s.Get(ctx, RevKey(i)); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("deleted key %d: got %v, want ErrNotFound", i, err)
		}
	}
}

// DiskUse is the allocated size of every file under dir, as an embedded
// engine's Size measures it (diskuse.Allocated).
func DiskUse(t *testing.T, dir string) int64 {
	t.Helper()
	n, err := diskuse.Allocated(dir)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Reopen writes to a store opened on dir (100 small keys, extra, an empty
// value, then a delete and a swap), closes it, opens dir again and checks
// that everything reads back and scans; a second Open of the directory
// in use must fail. extra holds what the engine stores its own way (a
// value in badger's value log, a key beside its namespace).
func Reopen(t *testing.T, dir string, open func(dir string) (kv.Store, error), extra map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	s, err := open(dir)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	var ops []kv.Op
	for i := range 100 {
		ops = append(ops, kv.Put(fmt.Appendf(nil, "k/%03d", i), fmt.Appendf(nil, "v%d", i)))
	}
	for k, v := range extra {
		ops = append(ops, kv.Put([]byte(k), v))
	}
	ops = append(ops, kv.Put([]byte("empty"), nil))
	if err := s.Commit(ctx, ops); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, []kv.Op{kv.Delete([]byte("k/050")), kv.CompareAndSwap([]byte("k/051"), []byte("v51"), []byte("x"))}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = open(dir)
	if err != nil {
		t.Fatalf("reopen %s: %v", dir, err)
	}
	defer s.Close()
	check := func(k string, want []byte) {
		t.Helper()
		got, err := s.Get(ctx, []byte(k))
		if want == nil {
			if !errors.Is(err, kv.ErrNotFound) {
				t.Errorf("Get(%q) after reopen = %q, %v; want ErrNotFound", k, got, err)
			}
			return
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("Get(%q) after reopen = %.20q, %v; want %.20q", k, got, err, want)
		}
	}
	check("k/000", []byte("v0"))
	check("k/099", []byte("v99"))
	check("k/050", nil)
	check("k/051", []byte("x"))
	for k, v := range extra {
		check(k, v)
	}
	check("empty", []byte{})
	it, err := s.Scan(ctx, kv.ScanOptions{Start: []byte("k/"), End: []byte("k0")})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	if n := len(strings.Fields(Drain(t, it))); n != 99 {
		t.Errorf("scan after reopen: %d keys, want 99", n)
	}
	if _, err := open(dir); err == nil {
		t.Errorf("second Open of a directory in use succeeded")
	}
}
