package etcdtest_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/engramkv/engram/internal/etcdtest"
)

// TestStartPutGet starts a real etcd, writes a key with etcdctl 3.6 and
// reads it back, then runs etcd again on the same data directory and reads
// it once more.
func TestStartPutGet(t *testing.T) {
	e := etcdtest.Start(t, etcdtest.Options{})
	if out, err := e.Etcdctl(t, "put", "/etcdtest/k", "v1"); err != nil || strings.TrimSpace(out) != "OK" {
		t.Fatalf("put: %q, %v", out, err)
	}
	get := func(e *etcdtest.Etcd) {
		t.Helper()
		out, err := e.Etcdctl(t, "get", "/etcdtest/k", "--print-value-only")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(out); got != "v1" {
			t.Fatalf("get /etcdtest/k = %q, want v1", got)
		}
	}
	get(e)

	if err := e.Stop(); err != nil {
		t.Fatal(err)
	}
	get(etcdtest.Start(t, etcdtest.Options{DataDir: e.DataDir}))
}

// TestEtcdutlVersion checks the tools found are the 3.6 release the
// snapshots are made with.
func TestEtcdutlVersion(t *testing.T) {
	out, err := etcdtest.Etcdutl(t, "version")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "etcdutl version: 3.6.") {
		t.Fatalf("etcdutl version: %q", out)
	}
	out, err = etcdtest.Etcdctl(t, "version")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "etcdctl version: 3.6.") {
		t.Fatalf("etcdctl version: %q", out)
	}
}

// TestStartRelease37 starts the etcd 3.7 server and checks, through its
// /version endpoint, that it is the release it was asked for.
func TestStartRelease37(t *testing.T) {
	e := etcdtest.Start(t, etcdtest.Options{Release: etcdtest.Release37})
	resp, err := http.Get(e.ClientURL + "/version")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Server string `json:"etcdserver"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v.Server, "3.7.") {
		t.Fatalf("etcd 3.7 server says it is %q", v.Server)
	}
}
