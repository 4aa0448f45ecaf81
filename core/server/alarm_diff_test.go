package server_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/etcdtest"
)

// alarmPair is a real etcd 3.6 and Engram, each with a small quota.
type alarmPair struct {
	*pair
	maint     [2]pb.MaintenanceClient
	endpoints [2]string
	quotas    [2]int64
	self      [2]uint64 // each server's member ID
}

func newAlarmPair(t *testing.T, ctx context.Context) *alarmPair {
	t.Helper()
	etcdtest.Require(t)
	// bbolt's file starts near 100 KiB; Engram's sizedStore at zero.
	const etcdQuota, engramQuota = 1 << 20, 64 << 10
	e := etcdtest.Start(t, etcdtest.Options{Args: []string{"--quota-backend-bytes=" + strconv.Itoa(etcdQuota)}})
	ec, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ec.Close() })
	srv := servertest.Start(t, &sizedStore{Store: memkv.New()}, servertest.Options{QuotaBackendBytes: engramQuota})
	gc := srv.Client(t)
	p := &alarmPair{pair: &pair{names: [2]string{"etcd", "engram"}}, endpoints: [2]string{e.Endpoint, srv.Endpoint}, quotas: [2]int64{etcdQuota, engramQuota}}
	for i, c := range []*clientv3.Client{ec, gc} {
		p.kv[i] = pb.NewKVClient(c.ActiveConnection())
		p.lease[i] = pb.NewLeaseClient(c.ActiveConnection())
		p.maint[i] = pb.NewMaintenanceClient(c.ActiveConnection())
		st, err := p.maint[i].Status(ctx, &pb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		p.self[i] = st.Header.MemberId
	}
	return p
}

// fill writes 4 KiB values on server i until a Put is refused, and returns
// the refusal; sizes differ between bbolt and Engram's engines, so each is
// driven over its own quota.
func (p *alarmPair) fill(t *testing.T, ctx context.Context, i int) error {
	t.Helper()
	val := []byte(strings.Repeat("q", 4096))
	for n := 0; n < 10000; n++ {
		_, err := p.kv[i].Put(ctx, &pb.PutRequest{Key: fmt.Appendf(nil, "fill/%05d", n), Value: val})
		if err != nil {
			return err
		}
	}
	t.Fatalf("%s: 10000 puts of 4 KiB fit under a quota of %d bytes", p.names[i], p.quotas[i])
	return nil
}

// showAlarms prints alarms with each server's own member ID as SELF.
func (p *alarmPair) showAlarms(i int, list []*pb.AlarmMember) string {
	var b strings.Builder
	for _, m := range list {
		id := strconv.FormatUint(m.MemberID, 16)
		if m.MemberID == p.self[i] {
			id = "SELF"
		}
		fmt.Fprintf(&b, "[%s %s]", id, m.Alarm)
	}
	return b.String()
}

// normalise replaces a server's member ID (decimal or hex) in text.
func (p *alarmPair) normalise(i int, s string) string {
	s = strings.ReplaceAll(s, strconv.FormatUint(p.self[i], 10), "SELF")
	return strings.ReplaceAll(s, strconv.FormatUint(p.self[i], 16), "SELF")
}

func ok[R any](R) string { return "ok" }

// TestDiffQuotaAlarm drives etcd 3.6 and Engram each over its quota and
// compares what they answer from then on: the refusal that raised NOSPACE,
// the writes refused while it is on, the reads, deletes, compaction and
// defragmentation still served, Alarm and Status, and, once space is given
// back, disarming and writing again.
func TestDiffQuotaAlarm(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
	defer cancel()
	p := newAlarmPair(t, ctx)
	var leases [2]int64
	for i := range 2 {
		r, err := p.lease[i].LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 600})
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = r.ID
	}
	var refused [2]string
	for i := range 2 {
		st, _ := status.FromError(p.fill(t, ctx, i))
		refused[i] = fmt.Sprintf("%s %q", st.Code(), st.Message())
	}
	if want, _ := status.FromError(rpctypes.ErrGRPCNoSpace); refused[0] != refused[1] || !strings.Contains(refused[0], want.Message()) {
		t.Errorf("over the quota:\n  etcd:   %s\n  engram: %s", refused[0], refused[1])
	}
	alarms := func(i int, r *pb.AlarmResponse) string { return p.showAlarms(i, r.Alarms) }
	sameAlarm := func(what string, req *pb.AlarmRequest) {
		t.Helper()
		var got [2]string
		for i := range 2 {
			r, err := p.maint[i].Alarm(ctx, req)
			if err != nil {
				got[i] = "error " + err.Error()
				continue
			}
			got[i] = alarms(i, r)
		}
		if got[0] != got[1] {
			t.Errorf("%s:\n  etcd:   %s\n  engram: %s", what, got[0], got[1])
		}
	}
	sameAlarm("alarm get", &pb.AlarmRequest{Action: pb.AlarmRequest_GET})
	sameAlarm("alarm get NOSPACE", &pb.AlarmRequest{Action: pb.AlarmRequest_GET, Alarm: pb.AlarmType_NOSPACE})
	sameAlarm("alarm get CORRUPT", &pb.AlarmRequest{Action: pb.AlarmRequest_GET, Alarm: pb.AlarmType_CORRUPT})

	put := &pb.PutRequest{Key: []byte("small"), Value: []byte("v")}
	same(t, p.pair, "put under NOSPACE", func(i int) (*pb.PutResponse, error) { return p.kv[i].Put(ctx, put) }, ok)
	txnPut := &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: put}}}}
	same(t, p.pair, "txn with a put under NOSPACE", func(i int) (*pb.TxnResponse, error) { return p.kv[i].Txn(ctx, txnPut) }, ok)
	txnElsePut := &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("nothing"), Target: pb.Compare_VERSION, Result: pb.Compare_GREATER}}, Failure: txnPut.Success}
	same(t, p.pair, "txn with a put in else under NOSPACE", func(i int) (*pb.TxnResponse, error) { return p.kv[i].Txn(ctx, txnElsePut) }, ok)
	same(t, p.pair, "lease grant under NOSPACE", func(i int) (*pb.LeaseGrantResponse, error) {
		return p.lease[i].LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
	}, ok)
	txnRead := &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("fill/00000")}}}}}
	same(t, p.pair, "read-only txn under NOSPACE", func(i int) (*pb.TxnResponse, error) { return p.kv[i].Txn(ctx, txnRead) },
		func(r *pb.TxnResponse) string {
			return fmt.Sprintf("succeeded=%v kvs=%d", r.Succeeded, len(r.Responses[0].GetResponseRange().Kvs))
		})
	txnDelete := &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte("fill/00002")}}}}}
	same(t, p.pair, "txn that only deletes under NOSPACE", func(i int) (*pb.TxnResponse, error) { return p.kv[i].Txn(ctx, txnDelete) },
		func(r *pb.TxnResponse) string {
			return fmt.Sprintf("succeeded=%v deleted=%d", r.Succeeded, r.Responses[0].GetResponseDeleteRange().Deleted)
		})
	same(t, p.pair, "lease revoke under NOSPACE", func(i int) (*pb.LeaseRevokeResponse, error) {
		return p.lease[i].LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: leases[i]})
	}, ok)
	same(t, p.pair, "range under NOSPACE", func(i int) (*pb.RangeResponse, error) {
		return p.kv[i].Range(ctx, &pb.RangeRequest{Key: []byte("fill/00001")})
	}, func(r *pb.RangeResponse) string { return fmt.Sprintf("kvs=%d", len(r.Kvs)) })
	same(t, p.pair, "status under NOSPACE", func(i int) (*pb.StatusResponse, error) { return p.maint[i].Status(ctx, &pb.StatusRequest{}) },
		func(r *pb.StatusResponse) string {
			i := 0
			if r.Header.MemberId == p.self[1] {
				i = 1
			}
			return fmt.Sprintf("errors=%q quota-is-configured=%v", p.normalise(i, strings.Join(r.Errors, "|")), r.DbSizeQuota == p.quotas[i])
		})
	// etcdctl 3.6 as an operator runs it.
	var lines [2]string
	for i, ep := range p.endpoints {
		out, err := etcdtest.Etcdctl(t, "--endpoints="+ep, "alarm", "list")
		lines[i] = p.normalise(i, out)
		if err != nil {
			lines[i] += " error " + err.Error()
		}
	}
	if lines[0] != lines[1] || !strings.Contains(lines[0], "alarm:NOSPACE") {
		t.Errorf("etcdctl alarm list:\n  etcd:   %q\n  engram: %q", lines[0], lines[1])
	}
	for i, ep := range p.endpoints {
		out, err := etcdtest.Etcdctl(t, "--endpoints="+ep, "endpoint", "status", "-w", "fields")
		if err != nil || !strings.Contains(out, fmt.Sprintf(`"Errors" : [memberID:%d alarm:NOSPACE `, p.self[i])) {
			t.Errorf("%s: etcdctl endpoint status shows no NOSPACE alarm (%v):\n%s", p.names[i], err, out)
		}
	}

	// Space comes back the way an operator gives it back.
	same(t, p.pair, "delete under NOSPACE", func(i int) (*pb.DeleteRangeResponse, error) {
		return p.kv[i].DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("fill/"), RangeEnd: []byte("fill0")})
	}, ok)
	same(t, p.pair, "compact under NOSPACE", func(i int) (*pb.CompactionResponse, error) {
		r, err := p.kv[i].Range(ctx, &pb.RangeRequest{Key: []byte("x")})
		if err != nil {
			return nil, err
		}
		return p.kv[i].Compact(ctx, &pb.CompactionRequest{Revision: r.Header.Revision, Physical: true})
	}, ok)
	same(t, p.pair, "defragment under NOSPACE", func(i int) (*pb.DefragmentResponse, error) {
		return p.maint[i].Defragment(ctx, &pb.DefragmentRequest{})
	}, ok)
	same(t, p.pair, "put still refused before disarming", func(i int) (*pb.PutResponse, error) { return p.kv[i].Put(ctx, put) }, ok)
	for i, ep := range p.endpoints {
		out, err := etcdtest.Etcdctl(t, "--endpoints="+ep, "alarm", "disarm")
		lines[i] = p.normalise(i, out)
		if err != nil {
			lines[i] += " error " + err.Error()
		}
	}
	if lines[0] != lines[1] {
		t.Errorf("etcdctl alarm disarm:\n  etcd:   %q\n  engram: %q", lines[0], lines[1])
	}
	sameAlarm("alarm get after disarm", &pb.AlarmRequest{Action: pb.AlarmRequest_GET})
	for i := range 2 {
		sameAlarm("deactivate what is not raised", &pb.AlarmRequest{Action: pb.AlarmRequest_DEACTIVATE, MemberID: p.self[i], Alarm: pb.AlarmType_NOSPACE})
	}
	same(t, p.pair, "put after disarm", func(i int) (*pb.PutResponse, error) { return p.kv[i].Put(ctx, put) }, ok)
	same(t, p.pair, "lease grant after disarm", func(i int) (*pb.LeaseGrantResponse, error) {
		return p.lease[i].LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
	}, ok)
	sameAlarm("activate NONE", &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, Alarm: pb.AlarmType_NONE})
	sameAlarm("get after activate NONE", &pb.AlarmRequest{Action: pb.AlarmRequest_GET})
}
