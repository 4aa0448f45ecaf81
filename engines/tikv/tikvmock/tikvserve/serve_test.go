package tikvserve

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/engines/tikv/tikvmock"
)

// TestOracleRanges checks that the timestamp ranges the oracle hands out
// never overlap and always increase, also when a millisecond's logical
// space runs out.
func TestOracleRanges(t *testing.T) {
	var o oracle
	lastP, lastL := int64(0), int64(0)
	for _, count := range []int64{1, 5, 1 << 17, 1 << 17, 3, 1} {
		p, l := o.next(count)
		first := l - count + 1
		if first < 1 || l >= 1<<logicalBits {
			t.Fatalf("range [%d, %d] at %d leaves the logical space", first, l, p)
		}
		if p < lastP || (p == lastP && first <= lastL) {
			t.Fatalf("range [%d, %d] at %d does not follow the last one, %d at %d", first, l, p, lastL, lastP)
		}
		lastP, lastL = p, l
	}
}

// TestEtcdKV checks the etcd API on the PD address with etcd's own client:
// what it stores survives a whole-cluster restart, ranges and prefixes
// answer as etcd's, and the member list names the PD address.
func TestEtcdKV(t *testing.T) {
	c, err := tikvmock.NewCluster()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := New(c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.PDAddr()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for _, k := range []string{"/gc/a", "/gc/b", "/gd"} {
		if _, err := cli.Put(ctx, k, "v"+k); err != nil {
			t.Fatalf("Put %s: %v", k, err)
		}
	}
	if _, err := cli.Put(ctx, "/gc/a", "again"); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	got, err := cli.Get(ctx, "/gc/a")
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "again" || got.Kvs[0].Version != 2 {
		t.Fatalf("Get /gc/a after the restart = %v, %v; want again at version 2", got, err)
	}
	got, err = cli.Get(ctx, "/gc/", clientv3.WithPrefix())
	if err != nil || len(got.Kvs) != 2 || string(got.Kvs[1].Key) != "/gc/b" {
		t.Fatalf("Get /gc/ prefix = %v, %v; want /gc/a and /gc/b", got, err)
	}
	if got, err := cli.Get(ctx, "/none"); err != nil || len(got.Kvs) != 0 {
		t.Fatalf("Get of an absent key = %v, %v", got, err)
	}
	members, err := cli.MemberList(ctx)
	if err != nil || len(members.Members) != 1 || members.Members[0].ClientURLs[0] != "http://"+s.PDAddr() {
		t.Fatalf("MemberList = %v, %v; want the PD address", members, err)
	}
	if m := s.Unimplemented(); len(m) > 0 {
		t.Errorf("etcd's client called what the fake does not serve: %v", m)
	}
}
