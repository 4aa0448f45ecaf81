package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/internal/etcdtest"
)

// The README's runbooks, run as written: back up with etcdctl and restore
// with `engram snapshot restore`; move a live etcd with `engram migrate`;
// leave for etcd with etcdutl. The real etcd 3.6 tools come from `make
// etcd-tools` (internal/etcdtest).

// hashkv runs `etcdctl endpoint hashkv --rev` and returns the hash.
func hashkv(t *testing.T, endpoint string, rev int64) uint32 {
	t.Helper()
	out, err := etcdtest.Etcdctl(t, "--endpoints="+endpoint, "endpoint", "hashkv", fmt.Sprintf("--rev=%d", rev), "-w", "json")
	if err != nil {
		t.Fatalf("etcdctl endpoint hashkv against %s: %v", endpoint, err)
	}
	var resp []struct {
		HashKV struct {
			Hash uint32 `json:"hash"`
		} `json:"HashKV"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil || len(resp) != 1 {
		t.Fatalf("etcdctl endpoint hashkv: %v\n%s", err, out)
	}
	return resp[0].HashKV.Hash
}

func writeSome(t *testing.T, c *clientv3.Client, prefix string, n int) int64 {
	t.Helper()
	ctx := context.Background()
	var rev int64
	for i := range n {
		ops := []clientv3.Op{clientv3.OpPut(fmt.Sprintf("%s/a%03d", prefix, i%37), fmt.Sprintf("v%d", i))}
		if i%5 == 0 {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s/b%03d", prefix, i%11), "txn"))
		}
		if i%7 == 0 {
			ops = append(ops, clientv3.OpDelete(fmt.Sprintf("%s/a%03d", prefix, (i+3)%37)))
		}
		r, err := c.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Header.Revision
	}
	return rev
}

// TestBackupAndRestoreRunbook: etcdctl snapshot save against Engram, then
// engram snapshot status and restore into a new data directory, and the
// restored server answers HashKV as the original did.
func TestBackupAndRestoreRunbook(t *testing.T) {
	etcdtest.Require(t)
	orig := startNode(t, nodeOptions{})
	c := orig.client(t)
	l, err := c.Grant(context.Background(), 3600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(context.Background(), "/registry/leases/n1", "x", clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	rev := writeSome(t, c, "/registry/configmaps/default", 200)
	if _, err := c.Compact(context.Background(), rev-50, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	rev = writeSome(t, c, "/registry/secrets/default", 20)
	want := hashkv(t, orig.endpoint, rev)

	file := filepath.Join(t.TempDir(), "backup.db")
	if out, err := etcdtest.Etcdctl(t, "--endpoints="+orig.endpoint, "snapshot", "save", file); err != nil {
		t.Fatalf("etcdctl snapshot save: %v\n%s", err, out)
	}
	out, code := runEngram(t, nil, "snapshot", "status", file, "-w", "json")
	if code != 0 || !strings.Contains(out, fmt.Sprintf(`"revision":%d`, rev)) {
		t.Fatalf("engram snapshot status: exit %d\n%s", code, out)
	}

	dir := t.TempDir()
	if out, code := runEngram(t, nil, "snapshot", "restore", file, "--data-dir="+dir); code != 0 {
		t.Fatalf("engram snapshot restore: exit %d\n%s", code, out)
	}
	// A second restore into the same directory is refused: it is not
	// empty any more.
	out, code = runEngram(t, nil, "snapshot", "restore", file, "--data-dir="+dir)
	if code != 1 || !strings.Contains(out, "not empty") {
		t.Fatalf("restore into a non-empty store: exit %d\n%s", code, out)
	}
	restored := startNode(t, nodeOptions{dataDir: dir})
	if got := hashkv(t, restored.endpoint, rev); got != want {
		t.Fatalf("HashKV at %d after restore: %d, the original said %d", rev, got, want)
	}
	ttl, err := restored.client(t).TimeToLive(context.Background(), l.ID, clientv3.WithAttachedKeys())
	if err != nil || ttl.GrantedTTL != 3600 || len(ttl.Keys) != 1 {
		t.Fatalf("the lease after restore: %+v %v", ttl, err)
	}
}

// TestRestoreRefusesBadFiles: a corrupt or truncated file is refused with
// an error naming the problem, and the data directory stays usable.
func TestRestoreRefusesBadFiles(t *testing.T) {
	t.Parallel()
	good, err := os.ReadFile(filepath.Join("..", "..", "core", "snapshot", "testdata", "etcd36-compacted.db"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	corrupt := bytes.Clone(good)
	corrupt[len(corrupt)/2] ^= 0x55
	for _, c := range []struct {
		name, want string
		data       []byte
	}{
		{"corrupt", "sha256", corrupt},
		{"truncated", "truncated", good[:len(good)/2]},
		{"not-a-snapshot", "not a bbolt", []byte(strings.Repeat("hello ", 10000))},
	} {
		file := filepath.Join(dir, c.name+".db")
		if err := os.WriteFile(file, c.data, 0o600); err != nil {
			t.Fatal(err)
		}
		out, code := runEngram(t, nil, "snapshot", "restore", file, "--data-dir="+filepath.Join(dir, c.name), "--skip-hash-check="+fmt.Sprint(c.name == "not-a-snapshot"))
		if code != 1 || !strings.Contains(strings.ToLower(out), c.want) {
			t.Fatalf("restore of a %s file: exit %d, want 1 and %q in:\n%s", c.name, code, c.want, out)
		}
	}
}

// TestMigrateRunbook moves a live etcd into Engram as the README says:
// engram migrate following the source while it takes writes, SIGUSR1 once
// its writers stop, engram serve on the result, engram migrate verify.
func TestMigrateRunbook(t *testing.T) {
	etcd := etcdtest.Start(t, etcdtest.Options{})
	src, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	rev := writeSome(t, src, "/registry/pods/ns1", 100)
	if _, err := src.Compact(context.Background(), rev-20); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	var logBuf syncBuffer
	wrote := logBuf.changed()
	cmd := exec.Command(suite.binary, "migrate", "--from="+etcd.ClientURL, "--data-dir="+dir)
	cmd.Env = cleanEnv("ENGRAM_")
	cmd.Stdout, cmd.Stderr = &logBuf, &logBuf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	following := func() bool { return strings.Contains(logBuf.String(), "engram migrate: following") }
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("engram migrate output:\n%s", logBuf.String())
		}
	})
	// The source keeps taking writes while the migration copies it and
	// then follows it.
	writeSome(t, src, "/registry/pods/ns2", 100)
	// Wait for the process's own announcement; the minute only keeps a
	// broken build from hanging the suite.
	announced := testCtx(t, time.Minute)
	for !following() {
		select {
		case err := <-done:
			t.Fatalf("engram migrate exited before following: %v", err)
		case <-wrote:
		case <-announced.Done():
			t.Fatal("engram migrate did not start following within a minute")
		}
	}
	writeSome(t, src, "/registry/pods/ns2", 150)
	final := writeSome(t, src, "/registry/events/ns1", 50)
	// The writers stopped: cut over.
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("engram migrate: %v\n%s", err, logBuf.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("engram migrate did not finish the cut-over\n%s", logBuf.String())
	}
	if !strings.Contains(logBuf.String(), fmt.Sprintf("resumes at revision %d", final)) {
		t.Fatalf("engram migrate did not report the cut-over at revision %d:\n%s", final, logBuf.String())
	}
	node := startNode(t, nodeOptions{dataDir: dir})
	if a, b := hashkv(t, etcd.Endpoint, final), hashkv(t, node.endpoint, final); a != b {
		t.Fatalf("HashKV at %d: etcd %d, Engram %d", final, a, b)
	}
	out, code := runEngram(t, nil, "migrate", "verify", "--from="+etcd.ClientURL, "--to="+node.endpoint)
	if code != 0 || !strings.Contains(out, "ok: HashKV") {
		t.Fatalf("engram migrate verify: exit %d\n%s", code, out)
	}
	// A write on Engram continues the source's revisions.
	r, err := node.client(t).Put(context.Background(), "/registry/after", "x")
	if err != nil || r.Header.Revision != final+1 {
		t.Fatalf("first write after the cut-over: %v %v, want revision %d", r, err, final+1)
	}
}

// TestBackToEtcdRunbook: Engram's snapshot restored by etcdutl; etcd 3.6
// starts on it at Engram's revision with the same HashKV.
func TestBackToEtcdRunbook(t *testing.T) {
	node := startNode(t, nodeOptions{})
	rev := writeSome(t, node.client(t), "/registry/services/default", 120)
	file := filepath.Join(t.TempDir(), "engram.db")
	if out, err := etcdtest.Etcdctl(t, "--endpoints="+node.endpoint, "snapshot", "save", file); err != nil {
		t.Fatalf("etcdctl snapshot save: %v\n%s", err, out)
	}
	etcd := etcdtest.Start(t, etcdtest.Options{DataDir: etcdtest.Restore(t, file)})
	if a, b := hashkv(t, node.endpoint, rev), hashkv(t, etcd.Endpoint, rev); a != b {
		t.Fatalf("HashKV at %d: Engram %d, etcd restored from its snapshot %d", rev, a, b)
	}
}

// syncBuffer is a bytes.Buffer safe for a process's writes and the test's
// reads at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	// wrote, once changed made it, receives a value after a Write.
	wrote chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wrote != nil {
		select {
		case s.wrote <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
	return s.b.Write(p)
}

// changed returns a channel that receives a value after each later Write
// (at most one pending), for a test waiting on the process's output.
func (s *syncBuffer) changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wrote == nil {
		s.wrote = make(chan struct{}, 1)
	}
	return s.wrote
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
