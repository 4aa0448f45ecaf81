package server_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/internal/etcdtest"
)

// headerFields are the parts of etcdctl's output that are each server's
// own (member and cluster IDs, revisions, raft terms).
var headerFields = regexp.MustCompile(`("?(?:cluster_id|member_id|revision|raft_term)"?):\d+`)

// clientLogs are clientv3's own log lines on etcdctl's standard error
// (retry warnings), which name timings and addresses.
var clientLogs = regexp.MustCompile(`(?m)^\{"level".*\n?`)

// TestAuthEtcdctl runs an operator's etcdctl 3.6 session against etcd 3.6
// and Engram and compares what etcdctl prints: users, a role with a
// prefix, auth enable, gets as root and as a restricted user (allowed and
// refused), auth status and auth disable.
func TestAuthEtcdctl(t *testing.T) {
	e := etcdtest.Start(t, etcdtest.Options{})
	g := servertest.Start(t, servertest.Options{Auth: server.AuthOptions{BcryptCost: 4}})
	steps := [][]string{
		{"user", "add", "root", "--new-user-password=rp"},
		{"user", "add", "alice", "--new-user-password=ap"},
		{"role", "add", "reader"},
		{"role", "grant-permission", "reader", "read", "/app/", "--prefix"},
		{"role", "get", "reader"},
		{"user", "grant-role", "alice", "reader"},
		{"user", "grant-role", "root", "root"},
		{"put", "/app/x", "1"},
		{"put", "/other", "2"},
		{"auth", "enable"},
		{"get", "/app/x"},
		{"--user=root:rp", "get", "/app/x"},
		{"--user=alice:ap", "get", "/app/x"},
		{"--user=alice:ap", "get", "/other"},
		{"--user=alice:ap", "put", "/app/x", "2"},
		{"--user=alice:wrong", "get", "/app/x"},
		{"--user=alice:ap", "user", "list"},
		{"--user=root:rp", "user", "list"},
		{"--user=root:rp", "user", "get", "alice"},
		{"--user=root:rp", "auth", "status", "-w", "json"},
		{"--user=root:rp", "auth", "disable"},
		{"get", "/other"},
		{"auth", "status", "-w", "json"},
	}
	for _, s := range steps {
		var out [2]string
		for i, ep := range []string{e.Endpoint, g.Endpoint} {
			o, err := etcdtest.Etcdctl(t, append([]string{"--endpoints=" + ep}, s...)...)
			o = strings.ReplaceAll(fmt.Sprintf("%s|%v", o, err), ep, "ENDPOINT")
			out[i] = headerFields.ReplaceAllString(clientLogs.ReplaceAllString(o, ""), "$1:N")
		}
		if out[0] != out[1] {
			t.Errorf("etcdctl %v:\n  etcd:   %s\n  engram: %s", s, out[0], out[1])
		}
	}
}
