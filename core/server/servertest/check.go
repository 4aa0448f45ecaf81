package servertest

import (
	"sort"
	"sync"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// CheckLoad checks the outcome of a write load whose every write created one
// key at a revision of its own, against a full listing of those keys: each
// write acknowledged at a revision is stored at that revision, and the
// stored revisions are dense from 2 (revision 1 is the empty store). mu
// guards acked. It returns the stored revisions, sorted.
func CheckLoad(t testing.TB, kvs []*mvccpb.KeyValue, mu *sync.Mutex, acked map[string]int64) []int64 {
	t.Helper()
	have := make(map[string]int64, len(kvs))
	revs := make([]int64, 0, len(kvs))
	for _, kv := range kvs {
		have[string(kv.Key)] = kv.ModRevision
		revs = append(revs, kv.ModRevision)
	}
	mu.Lock()
	for k, rev := range acked {
		if have[k] != rev {
			t.Errorf("acknowledged %s at revision %d, the store has %d", k, rev, have[k])
		}
	}
	mu.Unlock()
	sort.Slice(revs, func(i, j int) bool { return revs[i] < revs[j] })
	for i, r := range revs {
		if r != int64(i+2) {
			t.Fatalf("revisions not dense: position %d holds %d", i, r)
		}
	}
	return revs
}

// CheckWatched checks that a watcher of such a load saw each revision from 2
// on once and in order.
func CheckWatched(t testing.TB, revs []int64) {
	t.Helper()
	for i, r := range revs {
		if r != int64(i+2) {
			t.Fatalf("watcher: event %d has revision %d (gap or duplicate); saw %d events", i, r, len(revs))
		}
	}
}
