package etcdtest

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// serverOwn are the parts of etcdctl's output that are each server's own
// (member and cluster IDs, revisions, raft terms); clientLogs are clientv3's
// log lines on etcdctl's standard error, which name timings and addresses.
var (
	serverOwn  = regexp.MustCompile(`("?(?:cluster_id|member_id|revision|raft_term)"?):\d+`)
	clientLogs = regexp.MustCompile(`(?m)^\{"level".*\n?`)
)

// EtcdctlComparable runs etcdctl 3.6 against endpoint and returns what it
// printed and its error as one string in which what is each server's own is
// masked, so that the same command's answers from etcd and from Engram
// compare equal when only those differ.
func EtcdctlComparable(t testing.TB, endpoint string, args ...string) string {
	t.Helper()
	out, err := Etcdctl(t, append([]string{"--endpoints=" + endpoint}, args...)...)
	s := strings.ReplaceAll(fmt.Sprintf("%s|%v", out, err), endpoint, "ENDPOINT")
	return serverOwn.ReplaceAllString(clientLogs.ReplaceAllString(s, ""), "$1:N")
}
