package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/engramkv/engram/wasm/sdk"
)

// TestIndexAgainstModel sets and removes random keys (a small key space, so
// the tables fill, grow, and removals shift probe runs that wrap around
// their end) and checks the keys against a map.
func TestIndexAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	var x index
	m := map[string]string{}
	keys := make([]string, 5000)
	for i := range keys {
		keys[i] = fmt.Sprintf("/registry/pods/ns/p%d", i)
	}
	for round := range 60000 {
		k := keys[rng.IntN(len(keys))]
		if rng.IntN(3) == 0 {
			x.remove([]byte(k))
			delete(m, k)
		} else {
			v := fmt.Sprint(round)
			if rng.IntN(10) == 0 {
				v = ""
			}
			buf := []byte(k + v)
			x.set(buf[:len(k):len(k)], buf[len(k):])
			m[k] = v
		}
		if x.count != len(m) {
			t.Fatalf("round %d: index holds %d keys, model %d", round, x.count, len(m))
		}
		if round%4999 == 0 {
			for _, k := range keys {
				v, ok := x.get([]byte(k))
				want, wok := m[k]
				if ok != wok || string(v) != want {
					t.Fatalf("round %d: get(%q) = %q, %v; want %q, %v", round, k, v, ok, want, wok)
				}
			}
		}
	}
}

// TestStoreAgainstModel runs random commits through the store and checks
// Get against a map: the index and the tree must agree on every key.
func TestStoreAgainstModel(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 2))
	s := newStore(t)
	m := map[string]string{}
	for round := range 2000 {
		var ops []sdk.Op
		seen := map[string]bool{}
		for range 1 + rng.IntN(20) {
			k := fmt.Sprintf("k%03d", rng.IntN(400))
			if seen[k] {
				continue
			}
			seen[k] = true
			switch rng.IntN(3) {
			case 0:
				ops = append(ops, sdk.Op{Kind: sdk.OpDelete, Key: []byte(k)})
			default:
				ops = append(ops, sdk.Op{Kind: sdk.OpPut, Key: []byte(k), Value: fmt.Appendf(nil, "%d", round)})
			}
		}
		if err := s.Commit(ctx, ops); err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			if op.Kind == sdk.OpDelete {
				delete(m, string(op.Key))
			} else {
				m[string(op.Key)] = string(op.Value)
			}
		}
	}
	checkAgainstModel(t, s, m)
}

// checkAgainstModel checks every key of TestStoreAgainstModel's key space,
// through Get, the tree and the byte count, against the model.
func checkAgainstModel(t *testing.T, s *store, m map[string]string) {
	t.Helper()
	ctx := context.Background()
	var bytes int64
	for k, v := range m {
		bytes += int64(len(k) + len(v))
	}
	if n, err := s.Size(ctx); n != bytes || err != nil {
		t.Fatalf("Size = %d, %v; the model holds %d bytes", n, err, bytes)
	}
	for i := range 400 {
		k := fmt.Sprintf("k%03d", i)
		v, err := s.Get(ctx, []byte(k))
		want, ok := m[k]
		if ok != (err == nil) || string(v) != want {
			t.Fatalf("Get(%q) = %q, %v; want %q, present %v", k, v, err, want, ok)
		}
		tv, tok := s.t.Get([]byte(k))
		if tok != ok || string(tv) != want {
			t.Fatalf("tree Get(%q) = %q, %v; want %q, %v", k, tv, tok, want, ok)
		}
	}
}

// TestReclaimShrinksIndex: after most keys are deleted, Reclaim shrinks the
// index and every remaining key, and the byte count, stay as they were.
func TestReclaimShrinksIndex(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	m := map[string]string{}
	var ops []sdk.Op
	for i := range 400 {
		k, v := fmt.Sprintf("k%03d", i), fmt.Sprintf("value %d", i)
		ops = append(ops, sdk.Op{Kind: sdk.OpPut, Key: []byte(k), Value: []byte(v)})
		m[k] = v
	}
	if err := s.Commit(ctx, ops); err != nil {
		t.Fatal(err)
	}
	ops = ops[:0]
	for i := range 400 {
		if i%20 != 0 {
			k := fmt.Sprintf("k%03d", i)
			ops = append(ops, sdk.Op{Kind: sdk.OpDelete, Key: []byte(k)})
			delete(m, k)
		}
	}
	if err := s.Commit(ctx, ops); err != nil {
		t.Fatal(err)
	}
	slots := func() (n int) {
		for i := range s.idx.shards {
			n += len(s.idx.shards[i].slots)
		}
		return n
	}
	before := slots()
	if err := s.Reclaim(ctx); err != nil {
		t.Fatal(err)
	}
	after := slots()
	if after >= before {
		t.Errorf("index slots %d before Reclaim, %d after: nothing shrank", before, after)
	}
	checkAgainstModel(t, s, m)
}
