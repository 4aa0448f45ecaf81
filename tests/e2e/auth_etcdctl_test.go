package e2e

import (
	"strings"
	"testing"

	"github.com/engramkv/engram/internal/etcdtest"
)

// authRefusals sets up root and a user "u" who may only read "/a/"
// through etcdctl 3.6, enables auth, and answers what etcdctl prints for
// u's get and put of a key it may not touch; ok is false when the server
// does not serve users and roles.
func authRefusals(t *testing.T, endpoint string) (get, put string, ok bool) {
	t.Helper()
	ctl := func(args ...string) (string, error) {
		return etcdtest.Etcdctl(t, append([]string{"--endpoints=" + endpoint}, args...)...)
	}
	setup := [][]string{
		{"user", "add", "root", "--new-user-password=rp"},
		{"user", "grant-role", "root", "root"},
		{"user", "add", "u", "--new-user-password=up"},
		{"role", "add", "r"},
		{"role", "grant-permission", "r", "read", "/a/", "--prefix"},
		{"user", "grant-role", "u", "r"},
		{"auth", "enable"},
	}
	for i, args := range setup {
		if out, err := ctl(args...); err != nil {
			if i == 0 && strings.Contains(err.Error(), "Unimplemented") {
				return "", "", false
			}
			t.Fatalf("etcdctl %v: %v\n%s", args, err, out)
		}
	}
	_, gerr := ctl("--user=u:up", "get", "/c")
	_, perr := ctl("--user=u:up", "put", "/a/x", "v")
	if gerr == nil || perr == nil {
		t.Fatalf("refused calls succeeded: get %v, put %v", gerr, perr)
	}
	return errorLine(gerr.Error()), errorLine(perr.Error()), true
}

// errorLine is the "Error: ..." line etcdctl prints for a refused call,
// without the client's logs (addresses, times) around it.
func errorLine(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "Error:") {
			return l
		}
	}
	return out
}

// TestAuthEtcdctlRefusal: etcdctl 3.6 prints the same refusal for a
// restricted user's get and put on Engram as on etcd 3.6.
func TestAuthEtcdctlRefusal(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t, etcdtest.Options{})
	wantGet, wantPut, _ := authRefusals(t, e.Endpoint)
	t.Logf("etcd: get %q put %q", wantGet, wantPut)
	if !strings.Contains(wantGet, "etcdserver: permission denied") {
		t.Fatalf("etcd's refusal is not etcd 3.6's permission denied: %s", wantGet)
	}
	n := startNode(t, nodeOptions{})
	get, put, ok := authRefusals(t, n.endpoint)
	if !ok {
		t.Fatal("Engram answered Unimplemented to user add")
	}
	wantOutput(t, "refused get", get, wantGet)
	wantOutput(t, "refused put", put, wantPut)
}
