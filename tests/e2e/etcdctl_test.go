package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The etcdctl tests run Debian's etcdctl (3.4, v3 API) against engram and
// compare its printed output with what real etcd makes it print.

// getJSON is `etcdctl get -w json` output (keys and values base64 in JSON,
// decoded into []byte by encoding/json).
type getJSON struct {
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
	Count int64 `json:"count"`
}

func decodeJSON[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("decode etcdctl JSON: %v\n%s", err, out)
	}
	return v
}

func wantOutput(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}

func TestEtcdctlKV(t *testing.T) {
	t.Parallel()
	needEtcdctl(t)
	n := startNode(t, nodeOptions{})

	wantOutput(t, "put", n.etcdctl(t, "", "put", "foo", "bar"), "OK\n")
	wantOutput(t, "get", n.etcdctl(t, "", "get", "foo"), "foo\nbar\n")
	wantOutput(t, "get absent key", n.etcdctl(t, "", "get", "nope"), "")
	wantOutput(t, "overwrite", n.etcdctl(t, "", "put", "foo", "baz"), "OK\n")

	for _, kv := range [][2]string{{"p/a", "1"}, {"p/b", "2"}, {"p/c", "3"}, {"q", "outside"}} {
		n.etcdctl(t, "", "put", kv[0], kv[1])
	}
	wantOutput(t, "get --prefix", n.etcdctl(t, "", "get", "--prefix", "p/"), "p/a\n1\np/b\n2\np/c\n3\n")
	wantOutput(t, "get range [p/a, p/c)", n.etcdctl(t, "", "get", "p/a", "p/c"), "p/a\n1\np/b\n2\n")
	wantOutput(t, "get --prefix --limit", n.etcdctl(t, "", "get", "--prefix", "--limit=1", "p/"), "p/a\n1\n")

	// Revisions as etcd numbers them: one per write, starting at 2 after
	// the first write in a fresh store (revision 1 is the empty store).
	g := decodeJSON[getJSON](t, n.etcdctl(t, "", "get", "--prefix", "p/", "-w", "json"))
	if g.Count != 3 || len(g.Kvs) != 3 {
		t.Fatalf("get --prefix -w json: count=%d kvs=%d, want 3 and 3", g.Count, len(g.Kvs))
	}
	for i, kv := range g.Kvs {
		// foo, foo again, then p/a, p/b, p/c: revisions 2,3 then 4,5,6.
		if want := int64(4 + i); kv.CreateRevision != want || kv.ModRevision != want || kv.Version != 1 {
			t.Errorf("%s: create=%d mod=%d version=%d, want create=mod=%d version=1", kv.Key, kv.CreateRevision, kv.ModRevision, kv.Version, want)
		}
	}
	if g.Header.Revision != 7 {
		t.Errorf("header revision %d, want 7 (six puts on a fresh store)", g.Header.Revision)
	}
	foo := decodeJSON[getJSON](t, n.etcdctl(t, "", "get", "foo", "-w", "json"))
	if len(foo.Kvs) != 1 || foo.Kvs[0].Version != 2 || foo.Kvs[0].CreateRevision != 2 || foo.Kvs[0].ModRevision != 3 {
		t.Errorf("foo after two puts: %+v, want version 2, create 2, mod 3", foo.Kvs)
	}
	wantOutput(t, "get --rev (old value)", n.etcdctl(t, "", "get", "foo", "--rev=2"), "foo\nbar\n")

	wantOutput(t, "del --prefix", n.etcdctl(t, "", "del", "--prefix", "p/"), "3\n")
	wantOutput(t, "get --prefix after del", n.etcdctl(t, "", "get", "--prefix", "p/"), "")
	wantOutput(t, "del absent", n.etcdctl(t, "", "del", "p/a"), "0\n")
	wantOutput(t, "untouched key", n.etcdctl(t, "", "get", "q"), "q\noutside\n")
	wantOutput(t, "del single", n.etcdctl(t, "", "del", "foo"), "1\n")
}

func TestEtcdctlTxn(t *testing.T) {
	t.Parallel()
	needEtcdctl(t)
	n := startNode(t, nodeOptions{})
	n.etcdctl(t, "", "put", "t/k", "v1")

	// etcdctl txn reads compares, success ops and failure ops from stdin,
	// each block ended by an empty line.
	out := n.etcdctl(t, "value(\"t/k\") = \"v1\"\n\nput t/k \"v2\"\nget t/k\n\nput t/k \"never\"\n\n", "txn")
	wantOutput(t, "txn success branch", out, "SUCCESS\n\nOK\n\nt/k\nv2\n")

	out = n.etcdctl(t, "value(\"t/k\") = \"v1\"\n\nput t/k \"never\"\n\nput t/other \"else\"\n\n", "txn")
	wantOutput(t, "txn failure branch", out, "FAILURE\n\nOK\n")
	wantOutput(t, "after failed compare", n.etcdctl(t, "", "get", "--prefix", "t/"), "t/k\nv2\nt/other\nelse\n")

	// The create-if-absent idiom kube-apiserver uses: mod_revision == 0.
	out = n.etcdctl(t, "mod(\"t/new\") = \"0\"\n\nput t/new \"created\"\n\n\n", "txn")
	wantOutput(t, "create if absent", out, "SUCCESS\n\nOK\n")
	out = n.etcdctl(t, "mod(\"t/new\") = \"0\"\n\nput t/new \"again\"\n\nget t/new\n\n", "txn")
	wantOutput(t, "create if absent, present", out, "FAILURE\n\nt/new\ncreated\n")

	out = n.etcdctl(t, "version(\"t/k\") = \"2\"\n\ndel t/k\n\n\n", "txn")
	wantOutput(t, "compare version, delete", out, "SUCCESS\n\n1\n")
}

func TestEtcdctlWatch(t *testing.T) {
	t.Parallel()
	bin := needEtcdctl(t)
	n := startNode(t, nodeOptions{})
	cli := n.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	seed, err := cli.Put(ctx, "seed", "x")
	if err != nil {
		t.Fatal(err)
	}
	// --rev makes the watch start right after the seed write whenever
	// etcdctl gets connected, so no event can slip past it.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	args := append(n.etcdctlFlags(), "watch", "--prefix", "w/", fmt.Sprintf("--rev=%d", seed.Header.Revision+1))
	cmd := execEtcdctl(wctx, bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { wcancel(); _ = cmd.Wait() }()
	lines := newLineReader(stdout)

	for _, op := range [][]string{{"put", "w/a", "1"}, {"put", "outside", "no"}, {"put", "w/b", "2"}, {"del", "w/a"}, {"put", "w/b", "3"}} {
		n.etcdctl(t, "", op...)
	}
	got, err := lines.next(ctx, 12)
	if err != nil {
		t.Fatalf("etcdctl watch: %v; lines so far %q; stderr %s", err, got, stderr.String())
	}
	want := []string{"PUT", "w/a", "1", "PUT", "w/b", "2", "DELETE", "w/a", "", "PUT", "w/b", "3"}
	if !slices.Equal(got, want) {
		t.Fatalf("etcdctl watch output:\n got %q\nwant %q", got, want)
	}
}

var (
	leaseGrantRE = regexp.MustCompile(`^lease ([0-9a-f]+) granted with TTL\((\d+)s\)\n$`)
	leaseTTLRE   = regexp.MustCompile(`^lease ([0-9a-f]+) granted with TTL\((\d+)s\), remaining\((\d+)s\), attached keys\(\[(.*)\]\)\n$`)
)

// grantLease runs `etcdctl lease grant` and returns the hex lease ID.
func grantLease(t *testing.T, n *node, ttl int) string {
	t.Helper()
	out := n.etcdctl(t, "", "lease", "grant", strconv.Itoa(ttl))
	m := leaseGrantRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("lease grant output %q does not match %s", out, leaseGrantRE)
	}
	return m[1]
}

func TestEtcdctlLease(t *testing.T) {
	t.Parallel()
	needEtcdctl(t)
	n := startNode(t, nodeOptions{})

	id := grantLease(t, n, 60)
	wantOutput(t, "put --lease", n.etcdctl(t, "", "put", "--lease="+id, "l/k", "v"), "OK\n")
	wantOutput(t, "keep-alive --once", n.etcdctl(t, "", "lease", "keep-alive", "--once", id),
		fmt.Sprintf("lease %s keepalived with TTL(60)\n", id))

	out := n.etcdctl(t, "", "lease", "timetolive", "--keys", id)
	m := leaseTTLRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("lease timetolive output %q does not match %s", out, leaseTTLRE)
	}
	if m[1] != id || m[2] != "60" || m[4] != "l/k" {
		t.Fatalf("lease timetolive: id=%s granted=%s keys=%q, want %s, 60, l/k", m[1], m[2], m[4], id)
	}
	if rem, _ := strconv.Atoi(m[3]); rem <= 0 || rem > 60 {
		t.Fatalf("lease timetolive: remaining %ds, want within (0, 60]", rem)
	}
	if out := n.etcdctl(t, "", "lease", "list"); !strings.Contains(out, id) {
		t.Fatalf("lease list %q lacks %s", out, id)
	}

	wantOutput(t, "revoke", n.etcdctl(t, "", "lease", "revoke", id), fmt.Sprintf("lease %s revoked\n", id))
	wantOutput(t, "key of revoked lease", n.etcdctl(t, "", "get", "l/k"), "")
	wantOutput(t, "timetolive after revoke", n.etcdctl(t, "", "lease", "timetolive", id),
		fmt.Sprintf("lease %s already expired\n", id))

	// Expiry: the key goes away on its own once the lease's TTL passes
	// without keep-alives (etcd may round a tiny TTL up to its minimum).
	short := grantLease(t, n, 2)
	n.etcdctl(t, "", "put", "--lease="+short, "l/short", "v")
	// The expiry is awaited as the delete event it makes; the deadline only
	// guards against a lease that never expires.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := n.client(t)
	r, err := cli.Get(ctx, "l/short")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) > 0 {
		wch := cli.Watch(ctx, "l/short", clientv3.WithRev(r.Kvs[0].ModRevision+1))
		waitDelete(t, wch, "key attached to a 2s lease")
	}
	wantOutput(t, "key of expired lease", n.etcdctl(t, "", "get", "l/short"), "")
}

// waitDelete waits for a delete event on wch; what names the watched key in
// failure messages.
func waitDelete(t *testing.T, wch clientv3.WatchChan, what string) {
	t.Helper()
	for wr := range wch {
		if err := wr.Err(); err != nil {
			t.Fatalf("watching the %s: %v", what, err)
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return
			}
		}
	}
	t.Fatalf("the %s was not deleted before the deadline", what)
}

type endpointStatusJSON []struct {
	Endpoint string `json:"Endpoint"`
	Status   struct {
		Header struct {
			ClusterID uint64 `json:"cluster_id"`
			MemberID  uint64 `json:"member_id"`
			Revision  int64  `json:"revision"`
		} `json:"header"`
		Version string `json:"version"`
		DBSize  int64  `json:"dbSize"`
		Leader  uint64 `json:"leader"`
	} `json:"Status"`
}

type memberListJSON struct {
	Header struct {
		ClusterID uint64 `json:"cluster_id"`
		MemberID  uint64 `json:"member_id"`
	} `json:"header"`
	Members []struct {
		ID         uint64   `json:"ID"`
		Name       string   `json:"name"`
		ClientURLs []string `json:"clientURLs"`
	} `json:"members"`
}

func TestEtcdctlEndpointAndMembers(t *testing.T) {
	t.Parallel()
	needEtcdctl(t)
	n := startNode(t, nodeOptions{})
	n.etcdctl(t, "", "put", "k", "v")

	st := decodeJSON[endpointStatusJSON](t, n.etcdctl(t, "", "endpoint", "status", "-w", "json"))
	if len(st) != 1 {
		t.Fatalf("endpoint status: %d entries, want 1", len(st))
	}
	s := st[0].Status
	// kube-apiserver (1.31+) enables RequestWatchProgress, which
	// WatchList and ConsistentListFromCache need, only for a Status
	// version >= 3.5.13 (or in [3.4.31, 3.5.0)).
	if !versionAtLeast(s.Version, 3, 5, 13) {
		t.Errorf("endpoint status version %q, want >= 3.5.13", s.Version)
	}
	if s.Header.Revision != 2 {
		t.Errorf("endpoint status revision %d, want 2 after one put", s.Header.Revision)
	}
	if s.Header.MemberID == 0 || s.Leader != s.Header.MemberID {
		t.Errorf("endpoint status: member %x, leader %x; a single member leads itself", s.Header.MemberID, s.Leader)
	}

	// etcdctl 3.4 prints the health verdict on stderr.
	if out, errOut, err := n.etcdctlResult(t, "", "endpoint", "health"); err != nil || !strings.Contains(out+errOut, "is healthy") {
		t.Errorf("endpoint health: %v, stdout %q, stderr %q", err, out, errOut)
	}

	ml := decodeJSON[memberListJSON](t, n.etcdctl(t, "", "member", "list", "-w", "json"))
	if len(ml.Members) != 1 {
		t.Fatalf("member list: %d members, want 1", len(ml.Members))
	}
	m := ml.Members[0]
	if m.Name != n.name {
		t.Errorf("member name %q, want %q (--name)", m.Name, n.name)
	}
	if want := []string{n.listenURL()}; !slices.Equal(m.ClientURLs, want) {
		t.Errorf("member client URLs %q, want %q (advertise defaults to listen)", m.ClientURLs, want)
	}
	if m.ID != ml.Header.MemberID || m.ID != s.Header.MemberID {
		t.Errorf("member ID %x, header member %x, status member %x: want one ID", m.ID, ml.Header.MemberID, s.Header.MemberID)
	}
	if out := n.etcdctl(t, "", "member", "list"); !strings.Contains(out, n.name) {
		t.Errorf("member list table lacks the name: %q", out)
	}
}

// versionAtLeast reports whether the dotted version v (e.g. "3.6.0") is
// at least major.minor.patch.
func versionAtLeast(v string, major, minor, patch int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) != 3 {
		return false
	}
	var got [3]int
	for i, p := range parts {
		// Drop a pre-release or build suffix: "0-alpha.1", "0+abc".
		p, _, _ = strings.Cut(p, "-")
		p, _, _ = strings.Cut(p, "+")
		x, err := strconv.Atoi(p)
		if err != nil {
			return false
		}
		got[i] = x
	}
	want := [3]int{major, minor, patch}
	for i := range got {
		if got[i] != want[i] {
			return got[i] > want[i]
		}
	}
	return true
}
