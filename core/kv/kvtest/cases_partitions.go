package kvtest

import (
	"bytes"
	"context"
	"fmt"

	"github.com/engramkv/engram/core/kv"
)

// casePartitions checks that Partitions covers the asked range with
// contiguous ranges in key order, so that scanning them one after
// the other reads exactly what one Scan of the whole range reads.
func casePartitions(ctx context.Context, t T, s kv.Store) {
	m := model{}
	for i := range 2000 {
		m[fmt.Sprintf("p/%04d", i)] = key("%d", i)
	}
	m["a"], m["z"] = []byte("a"), []byte("z")
	load(ctx, t, s, m, 500)
	for _, r := range []kv.Range{
		{},
		{Start: []byte("p/0100"), End: []byte("p/1500")},
		{Start: nil, End: []byte("p/0500")},
		{Start: []byte("p/1000"), End: nil},
		{Start: []byte{0x00}, End: []byte{0xFF}},
	} {
		parts, err := s.Partitions(ctx, r.Start, r.End)
		if err != nil {
			t.Fatalf("Partitions(%s, %s): %v", show(r.Start), show(r.End), err)
		}
		if len(parts) == 0 {
			t.Errorf("Partitions(%s, %s) returned no ranges for a non-empty range", show(r.Start), show(r.End))
			continue
		}
		if !bytes.Equal(parts[0].Start, r.Start) {
			t.Errorf("Partitions(%s, %s): first range starts at %s", show(r.Start), show(r.End), show(parts[0].Start))
		}
		if last := parts[len(parts)-1].End; !bytes.Equal(last, r.End) {
			t.Errorf("Partitions(%s, %s): last range ends at %s", show(r.Start), show(r.End), show(last))
		}
		var union []kv.Pair
		for i, p := range parts {
			if i > 0 && !bytes.Equal(parts[i-1].End, p.Start) {
				t.Errorf("Partitions(%s, %s): gap or overlap between range %d ending %s and range %d starting %s",
					show(r.Start), show(r.End), i-1, show(parts[i-1].End), i, show(p.Start))
			}
			if len(p.End) > 0 && bytes.Compare(p.Start, p.End) >= 0 {
				t.Errorf("Partitions(%s, %s): range %d [%s, %s) is empty or inverted", show(r.Start), show(r.End), i, show(p.Start), show(p.End))
			}
			if len(p.End) == 0 && i != len(parts)-1 {
				t.Errorf("Partitions(%s, %s): unbounded range %d is not the last", show(r.Start), show(r.End), i)
			}
			union = append(union, scanAll(ctx, t, s, kv.ScanOptions{Start: p.Start, End: p.End})...)
		}
		want := m.scan(kv.ScanOptions{Start: r.Start, End: r.End})
		if diff := diffPairs(union, want); diff != "" {
			t.Errorf("Partitions(%s, %s): scanning the %d ranges in order differs from the whole range: %s",
				show(r.Start), show(r.End), len(parts), diff)
		}
	}
	// An empty range may be returned as nothing or as ranges holding nothing.
	parts, err := s.Partitions(ctx, []byte("p/0500"), []byte("p/0500"))
	if err != nil {
		t.Fatalf("Partitions of an empty range: %v", err)
	}
	for _, p := range parts {
		if got := scanAll(ctx, t, s, kv.ScanOptions{Start: p.Start, End: p.End}); len(got) != 0 {
			t.Errorf("Partitions of an empty range returned [%s, %s) holding %d pairs", show(p.Start), show(p.End), len(got))
		}
	}
}
