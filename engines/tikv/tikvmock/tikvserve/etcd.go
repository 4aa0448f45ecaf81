package tikvserve

import (
	"bytes"
	"context"
	"slices"
	"sync"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// memberID is the fake PD's member ID, in PD's and in etcd's answers.
const memberID = 1

// etcdKV is the part of PD's embedded etcd that client-go's safe point KV
// (tikv.NewEtcdSafePointKV) uses: Range on single keys and prefixes (the
// KV's reads; client-go polls the saved GC safe point with them), Put (its
// write, with which TiDB's GC worker saves that safe point; the adaptor
// never calls it, tests do), and the member list its client syncs its
// endpoints from. The keys live in memory, across Stop and Start.
type etcdKV struct {
	etcdserverpb.UnimplementedKVServer
	etcdserverpb.UnimplementedClusterServer
	addr string

	mu  sync.Mutex
	rev int64
	kvs map[string]*mvccpb.KeyValue
}

func newEtcdKV(addr string) *etcdKV {
	return &etcdKV{addr: addr, rev: 1, kvs: map[string]*mvccpb.KeyValue{}}
}

// header is the response header at the current revision; e.mu is held.
func (e *etcdKV) header() *etcdserverpb.ResponseHeader {
	return &etcdserverpb.ResponseHeader{ClusterId: memberID, MemberId: memberID, Revision: e.rev, RaftTerm: 1}
}

func (e *etcdKV) Range(_ context.Context, req *etcdserverpb.RangeRequest) (*etcdserverpb.RangeResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var found []*mvccpb.KeyValue
	for _, kv := range e.kvs {
		if inRange(kv.Key, req.GetKey(), req.GetRangeEnd()) {
			found = append(found, kv)
		}
	}
	slices.SortFunc(found, func(a, b *mvccpb.KeyValue) int { return bytes.Compare(a.Key, b.Key) })
	resp := &etcdserverpb.RangeResponse{Header: e.header(), Count: int64(len(found))}
	if req.GetCountOnly() {
		return resp, nil
	}
	if l := req.GetLimit(); l > 0 && int64(len(found)) > l {
		found, resp.More = found[:l], true
	}
	for _, kv := range found {
		kv = &mvccpb.KeyValue{Key: kv.Key, Value: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version}
		if req.GetKeysOnly() {
			kv.Value = nil
		}
		resp.Kvs = append(resp.Kvs, kv)
	}
	return resp, nil
}

// inRange is etcd's range rule: one key without an end, [key, end)
// with one, and everything from key on for the end "\x00".
func inRange(k, key, end []byte) bool {
	switch {
	case len(end) == 0:
		return bytes.Equal(k, key)
	case bytes.Equal(end, []byte{0}):
		return bytes.Compare(k, key) >= 0
	default:
		return bytes.Compare(k, key) >= 0 && bytes.Compare(k, end) < 0
	}
}

func (e *etcdKV) Put(_ context.Context, req *etcdserverpb.PutRequest) (*etcdserverpb.PutResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rev++
	prev := e.kvs[string(req.GetKey())]
	kv := &mvccpb.KeyValue{Key: bytes.Clone(req.GetKey()), Value: bytes.Clone(req.GetValue()), CreateRevision: e.rev, ModRevision: e.rev, Version: 1}
	if prev != nil {
		kv.CreateRevision, kv.Version = prev.CreateRevision, prev.Version+1
	}
	e.kvs[string(kv.Key)] = kv
	resp := &etcdserverpb.PutResponse{Header: e.header()}
	if req.GetPrevKv() {
		resp.PrevKv = prev
	}
	return resp, nil
}

// MemberList names the fake PD, so a client that syncs its endpoints keeps
// this one.
func (e *etcdKV) MemberList(context.Context, *etcdserverpb.MemberListRequest) (*etcdserverpb.MemberListResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	url := "http://" + e.addr
	m := &etcdserverpb.Member{ID: memberID, Name: "tikvserve-pd", PeerURLs: []string{url}, ClientURLs: []string{url}}
	return &etcdserverpb.MemberListResponse{Header: e.header(), Members: []*etcdserverpb.Member{m}}, nil
}
