package tikvmock_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/engines/tikv"
	"github.com/engramkv/engram/engines/tikv/tikvmock"
)

// TestRegionStats: the mock's statistics of a namespace count every MVCC
// version its keys have (overwrites and deletions add, across regions and
// past one page of the scan), nothing of a neighbouring namespace, and
// are what the adaptor's Size reports.
func TestRegionStats(t *testing.T) {
	ctx := context.Background()
	c, err := tikvmock.NewCluster([]byte("a/k0500"), []byte("a/k1000"), []byte("b/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	open := func(prefix string) *tikv.Store {
		s, err := c.Open(tikv.Options{Prefix: []byte(prefix)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := open("a/"), open("b/")
	stats := func(prefix string) tikv.RegionStats {
		t.Helper()
		end := append([]byte(prefix[:len(prefix)-1]), prefix[len(prefix)-1]+1)
		st, err := c.RegionStats(ctx, []byte(prefix), end)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	commit := func(s *tikv.Store, ops ...kv.Op) {
		t.Helper()
		if err := s.Commit(ctx, ops); err != nil {
			t.Fatal(err)
		}
	}
	if st := stats("a/"); st != (tikv.RegionStats{}) {
		t.Fatalf("empty namespace: %+v", st)
	}

	const n = 1500 // more than one page of the mock's scan, over three regions
	val := bytes.Repeat([]byte("v"), 100)
	for i := 0; i < n; i += 100 {
		var ops []kv.Op
		for j := i; j < i+100; j++ {
			ops = append(ops, kv.Op{Kind: kv.OpPut, Key: fmt.Appendf(nil, "k%04d", j), Value: val})
		}
		commit(a, ops...)
	}
	// client-go commits the keys outside the primary's region in the
	// background; a scan resolves what is still locked, so that each key
	// is measured as a committed version.
	settle(t, a)
	written := stats("a/")
	if written.Keys != n || written.Bytes < n*int64(len("a/k0000")+len(val)) {
		t.Fatalf("after %d puts of %d bytes: %+v", n, len(val), written)
	}
	commit(a, kv.Op{Kind: kv.OpPut, Key: []byte("k0000"), Value: val})
	commit(a, kv.Op{Kind: kv.OpDelete, Key: []byte("k0001")})
	settle(t, a)
	after := stats("a/")
	if after.Keys != n+2 || after.Bytes <= written.Bytes {
		t.Errorf("an overwrite and a deletion are versions too: %+v after %+v", after, written)
	}
	if st := stats("b/"); st != (tikv.RegionStats{}) {
		t.Errorf("the neighbouring namespace counts %+v", st)
	}
	commit(b, kv.Op{Kind: kv.OpPut, Key: []byte("x"), Value: val})
	if st := stats("a/"); st != after {
		t.Errorf("a write in b/ changed a/'s statistics: %+v, was %+v", st, after)
	}
	if size, err := a.Size(); err != nil || size != after.Bytes {
		t.Errorf("Size = %d, %v; want the mock's %d", size, err, after.Bytes)
	}
}

// settle reads every key of s, which leaves none of them locked.
func settle(t *testing.T, s *tikv.Store) {
	t.Helper()
	ctx := context.Background()
	it, err := s.Scan(ctx, kv.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	for {
		batch, err := it.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(batch) == 0 {
			return
		}
	}
}
