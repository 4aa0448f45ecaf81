package snapshot

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/engramkv/engram/core/etcdfmt"
)

// genHistory simulates etcd's key space through revs write transactions
// (revisions 2..revs+1, as etcd starts at 1) of one to three changes each
// over nkeys keys: puts with values of up to maxValue bytes, some attached
// to one of leases, and deletes. It returns the key bucket's rows before
// any compaction.
func genHistory(rng *rand.Rand, revs, nkeys, maxValue int, leases []int64) []etcdfmt.Entry {
	type state struct {
		create, version int64
	}
	live := map[string]*state{}
	var rows []etcdfmt.Entry
	for rev := int64(2); rev < int64(revs)+2; rev++ {
		n := 1 + rng.IntN(3)
		used := map[string]bool{}
		for sub := int64(0); sub < int64(n); sub++ {
			k := fmt.Sprintf("/registry/things/ns-%d/thing-%03d", rng.IntN(3), rng.IntN(nkeys))
			if used[k] {
				continue
			}
			used[k] = true
			e := etcdfmt.Entry{Rev: etcdfmt.Revision{Main: rev, Sub: int64(len(used) - 1)}}
			e.KV.Key = []byte(k)
			e.KV.ModRevision = rev
			s := live[k]
			if s != nil && rng.IntN(4) == 0 {
				e.Tombstone = true
				delete(live, k)
			} else {
				if s == nil {
					s = &state{create: rev}
					live[k] = s
				}
				s.version++
				e.KV.CreateRevision, e.KV.Version = s.create, s.version
				e.KV.Value = make([]byte, rng.IntN(maxValue+1))
				for i := range e.KV.Value {
					e.KV.Value[i] = byte('a' + rng.IntN(26))
				}
				if len(leases) > 0 && rng.IntN(4) == 0 {
					e.KV.Lease = leases[rng.IntN(len(leases))]
				}
			}
			rows = append(rows, e)
		}
	}
	markLatest(rows)
	return rows
}

// markLatest sets Latest on each key's last row.
func markLatest(rows []etcdfmt.Entry) {
	seen := map[string]bool{}
	for i := len(rows) - 1; i >= 0; i-- {
		k := string(rows[i].KV.Key)
		rows[i].Latest = !seen[k]
		seen[k] = true
	}
}

// compact returns what etcd keeps of rows after compacting at rev: every
// row above rev and each key's latest row at or below rev unless it is a
// tombstone.
func compact(rows []etcdfmt.Entry, rev int64) []etcdfmt.Entry {
	latest := map[string]int{}
	for i, e := range rows {
		if e.Rev.Main <= rev {
			latest[string(e.KV.Key)] = i
		}
	}
	var out []etcdfmt.Entry
	for i, e := range rows {
		if e.Rev.Main > rev || latest[string(e.KV.Key)] == i && !e.Tombstone {
			out = append(out, e)
		}
	}
	return out
}

// hashKV computes etcd's HashKV at rev over a key bucket compacted at
// compactRev (0: never), with etcdfmt's rule: keep holds each key's latest
// row at or below rev while it is not a tombstone.
func hashKV(rows []etcdfmt.Entry, compactRev, rev int64) uint32 {
	latest := map[string]etcdfmt.Revision{}
	tomb := map[string]bool{}
	for _, e := range rows {
		if e.Rev.Main <= rev {
			latest[string(e.KV.Key)] = e.Rev
			tomb[string(e.KV.Key)] = e.Tombstone
		}
	}
	keepEmpty := true
	for k := range latest {
		if !tomb[k] {
			keepEmpty = false
		}
	}
	h := etcdfmt.NewHasher()
	for i := range rows {
		e := &rows[i]
		k := string(e.KV.Key)
		inKeep := latest[k] == e.Rev && !tomb[k]
		if etcdfmt.Hashed(e, compactRev, rev, inKeep, keepEmpty) {
			h.Add(e)
		}
	}
	return h.Sum()
}

// liveCount is etcdutl status's "total keys" over rows.
func liveCount(rows []etcdfmt.Entry) int {
	live := map[string]bool{}
	for _, e := range rows {
		live[string(e.KV.Key)] = !e.Tombstone
	}
	n := 0
	for _, l := range live {
		if l {
			n++
		}
	}
	return n
}

// feed yields rows in order, as Write wants them.
func feed(rows []etcdfmt.Entry) func(func(*etcdfmt.Entry) error) error {
	return func(yield func(*etcdfmt.Entry) error) error {
		for i := range rows {
			if err := yield(&rows[i]); err != nil {
				return err
			}
		}
		return nil
	}
}

// readEntries returns f's rows.
func readEntries(t testing.TB, f *File) []etcdfmt.Entry {
	t.Helper()
	var rows []etcdfmt.Entry
	if err := f.Entries(context.Background(), func(e *etcdfmt.Entry) error {
		rows = append(rows, *e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return rows
}

// diffRows reports the first difference between two row lists in etcd's
// terms (bucket key and value; Latest is export metadata and not compared).
func diffRows(got, want []etcdfmt.Entry) error {
	for i := range min(len(got), len(want)) {
		g, w := &got[i], &want[i]
		if !bytes.Equal(g.BucketKey(), w.BucketKey()) || !bytes.Equal(g.BucketValue(), w.BucketValue()) {
			return fmt.Errorf("row %d: got %x %q, want %x %q", i, g.BucketKey(), g.BucketValue(), w.BucketKey(), w.BucketValue())
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("%d rows, want %d", len(got), len(want))
	}
	return nil
}
