package snapshot

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/engramkv/engram/core/etcdfmt"
	"github.com/engramkv/engram/internal/etcdtest"
)

// These tests hand files Write made to etcd 3.6's own tools. They skip
// when bin/etcdutl and friends are missing (make etcd-tools), unless CI is
// set.

// etcdutlStatus is `etcdutl snapshot status -w json`.
type etcdutlStatus struct {
	Hash      uint32 `json:"hash"`
	Revision  int64  `json:"revision"`
	TotalKey  int    `json:"totalKey"`
	TotalSize int64  `json:"totalSize"`
	Version   string `json:"version"`
}

func statusOf(t *testing.T, path string) etcdutlStatus {
	t.Helper()
	out, err := etcdtest.Etcdutl(t, "snapshot", "status", path, "-w", "json")
	if err != nil {
		t.Fatal(err)
	}
	var st etcdutlStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("etcdutl snapshot status: %v: %s", err, out)
	}
	return st
}

// checkStatus compares etcdutl's status of path with info.
func checkStatus(t *testing.T, path string, info Info, lastMain int64) {
	t.Helper()
	st := statusOf(t, path)
	want := etcdutlStatus{Hash: info.Hash, Revision: lastMain, TotalKey: info.TotalKeys, TotalSize: info.TotalSize, Version: info.StorageVersion}
	if st != want {
		t.Errorf("etcdutl snapshot status = %+v, Info says %+v", st, want)
	}
}

func TestEtcdutlStatus(t *testing.T) {
	etcdtest.Require(t)
	path, rows, _, info := writeHistory(t, 500, 300, testLeases)
	checkStatus(t, path, info, rows[len(rows)-1].Rev.Main)
	if err := AppendTrailer(path); err != nil {
		t.Fatal(err)
	}
	checkStatus(t, path, info, rows[len(rows)-1].Rev.Main)
}

// TestEtcdutlHashKV checks etcdfmt's HashKV rule on files Write made
// against etcd's own (etcdutl hashkv opens the file as etcd's backend).
// Its rows have no leases: etcdutl hashkv has no lessor to attach them to.
func TestEtcdutlHashKV(t *testing.T) {
	etcdtest.Require(t)
	rng := rand.New(rand.NewPCG(5, 5))
	all := genHistory(rng, 200, 15, 50, nil)
	last := all[len(all)-1].Rev.Main
	for _, compactRev := range []int64{0, last / 3, last} {
		t.Run(fmt.Sprint("compacted at ", compactRev), func(t *testing.T) {
			rows := all
			if compactRev > 0 {
				rows = compact(all, compactRev)
			}
			path := filepath.Join(t.TempDir(), "snap.db")
			if _, err := Write(t.Context(), path, WriteOptions{CompactRev: compactRev, Revision: last}, feed(rows)); err != nil {
				t.Fatal(err)
			}
			for _, rev := range []int64{max(compactRev, 1), (max(compactRev, 1) + last) / 2, last} {
				// etcdutl hashkv opens the backend for writing.
				cp := filepath.Join(t.TempDir(), "copy.db")
				copyFile(t, path, cp)
				out, err := etcdtest.Etcdutl(t, "hashkv", cp, "--rev", strconv.FormatInt(rev, 10), "-w", "json")
				if err != nil {
					t.Fatal(err)
				}
				var got struct {
					Hash            uint32 `json:"hash"`
					HashRevision    int64  `json:"hashRevision"`
					CompactRevision int64  `json:"compactRevision"`
				}
				if err := json.Unmarshal([]byte(out), &got); err != nil {
					t.Fatalf("etcdutl hashkv: %v: %s", err, out)
				}
				wantCompact := compactRev
				if wantCompact == 0 {
					wantCompact = -1 // etcd's "never compacted"
				}
				if want := hashKV(rows, compactRev, rev); got.Hash != want || got.HashRevision != rev || got.CompactRevision != wantCompact {
					t.Errorf("rev %d: etcdutl hashkv = %+v, want hash %d, compact revision %d", rev, got, want, wantCompact)
				}
			}
		})
	}
}

// TestEtcdutlRestore restores files Write made with etcdutl, runs etcd on
// them and checks what etcd serves: revision, compaction, latest values,
// leases and HashKV.
func TestEtcdutlRestore(t *testing.T) {
	etcdtest.Require(t)
	path, rows, opts, info := writeHistory(t, 400, 200, testLeases)

	// Without a trailer etcdutl needs --skip-hash-check, exactly as Open.
	out, err := etcdtest.Etcdutl(t, "snapshot", "restore", path, "--data-dir", filepath.Join(t.TempDir(), "r"))
	if err == nil || !strings.Contains(err.Error(), "snapshot missing hash") {
		t.Fatalf("etcdutl restore without trailer: %v %s; want a refusal", err, out)
	}
	if _, err := etcdtest.Etcdutl(t, "snapshot", "restore", path, "--skip-hash-check", "--data-dir", filepath.Join(t.TempDir(), "r")); err != nil {
		t.Fatal(err)
	}

	if err := AppendTrailer(path); err != nil {
		t.Fatal(err)
	}
	e := etcdtest.Start(t, etcdtest.Options{DataDir: etcdtest.Restore(t, path)})

	var got struct {
		Header struct {
			Revision int64 `json:"revision"`
		} `json:"header"`
		Kvs []struct {
			Key            []byte `json:"key"`
			Value          []byte `json:"value"`
			CreateRevision int64  `json:"create_revision"`
			ModRevision    int64  `json:"mod_revision"`
			Version        int64  `json:"version"`
			Lease          int64  `json:"lease"`
		} `json:"kvs"`
	}
	out, err = e.Etcdctl(t, "get", "", "--from-key", "-w", "json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("etcdctl get: %v: %s", err, out)
	}
	if got.Header.Revision != info.Revision {
		t.Errorf("etcd serves revision %d, Info.Revision is %d", got.Header.Revision, info.Revision)
	}
	var want []etcdfmt.Entry
	for _, r := range rows {
		if r.Latest && !r.Tombstone {
			want = append(want, r)
		}
	}
	if len(got.Kvs) != len(want) {
		t.Fatalf("etcd serves %d keys, want %d", len(got.Kvs), len(want))
	}
	byKey := map[string]etcdfmt.Entry{}
	for _, r := range want {
		byKey[string(r.KV.Key)] = r
	}
	for _, kv := range got.Kvs {
		w, ok := byKey[string(kv.Key)]
		if !ok || !bytes.Equal(kv.Value, w.KV.Value) || kv.CreateRevision != w.KV.CreateRevision ||
			kv.ModRevision != w.KV.ModRevision || kv.Version != w.KV.Version || kv.Lease != w.KV.Lease {
			t.Errorf("etcd serves %q = %q (create %d mod %d version %d lease %d), want %+v",
				kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease, w.KV)
		}
	}

	// History below the compact revision is gone, at it is served.
	if _, err := e.Etcdctl(t, "get", "", "--from-key", "--rev", strconv.FormatInt(opts.CompactRev-1, 10)); err == nil || !strings.Contains(err.Error(), "compacted") {
		t.Errorf("get below the compact revision: %v, want compacted", err)
	}
	if _, err := e.Etcdctl(t, "get", "", "--from-key", "--rev", strconv.FormatInt(opts.CompactRev, 10)); err != nil {
		t.Errorf("get at the compact revision: %v", err)
	}

	for _, rev := range []int64{opts.CompactRev, (opts.CompactRev + info.Revision) / 2, info.Revision} {
		out, err := e.Etcdctl(t, "endpoint", "hashkv", "--rev", strconv.FormatInt(rev, 10), "-w", "json")
		if err != nil {
			t.Fatal(err)
		}
		var hs []struct {
			HashKV struct {
				Hash            uint32 `json:"hash"`
				CompactRevision int64  `json:"compact_revision"`
				HashRevision    int64  `json:"hash_revision"`
			} `json:"HashKV"`
		}
		if err := json.Unmarshal([]byte(out), &hs); err != nil || len(hs) != 1 {
			t.Fatalf("etcdctl endpoint hashkv: %v: %s", err, out)
		}
		if h, want := hs[0].HashKV, hashKV(rows, opts.CompactRev, rev); h.Hash != want || h.CompactRevision != opts.CompactRev || h.HashRevision != rev {
			t.Errorf("rev %d: etcd's HashKV = %+v, want hash %d compact revision %d", rev, h, want, opts.CompactRev)
		}
	}

	out, err = e.Etcdctl(t, "lease", "list", "-w", "json")
	if err != nil {
		t.Fatal(err)
	}
	var ll struct {
		Leases []struct {
			ID int64 `json:"id"`
		} `json:"leases"`
	}
	if err := json.Unmarshal([]byte(out), &ll); err != nil {
		t.Fatalf("etcdctl lease list: %v: %s", err, out)
	}
	gotIDs := map[int64]bool{}
	for _, l := range ll.Leases {
		gotIDs[l.ID] = true
	}
	for _, l := range testLeases {
		if !gotIDs[l.ID] {
			t.Errorf("etcd lost lease %x; it has %v", l.ID, ll.Leases)
		}
	}
}
