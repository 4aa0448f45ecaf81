package servertest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/internal/etcdtest"
)

// CheckSpace is the operator's round on the space an engine reports, with
// etcdctl 3.6, for any engine that is a kv.Sizer: Status answers a non-zero
// DbSize; etcd_mvcc_db_total_size_in_bytes in reg (nil: not checked)
// says the same; 4 KiB puts under fill/ are refused with etcd's no-space
// error once srv's QuotaBackendBytes is reached; `etcdctl alarm list` and
// `endpoint status` show the NOSPACE alarm, and `etcdctl put` is refused in
// etcd's words. It leaves the alarm raised and returns the client, for the
// caller to go on (defrag, disarm) and check what its engine did.
func CheckSpace(t testing.TB, ctx context.Context, srv *Server, reg prometheus.Gatherer) AlarmClient {
	t.Helper()
	etcdtest.Require(t)
	if srv.quota <= 0 {
		t.Fatal("servertest.CheckSpace needs a server started with QuotaBackendBytes")
	}
	a := NewAlarmClient(t, ctx, srv.Client(t))
	status := func() *pb.StatusResponse {
		t.Helper()
		st, err := a.Maint.Status(ctx, &pb.StatusRequest{})
		if err != nil {
			t.Fatalf("Status: %v", err)
		}
		return st
	}
	before := status()
	if before.DbSize <= 0 {
		t.Errorf("Status: DbSize %d, want the engine's size", before.DbSize)
	}
	if reg != nil {
		// Size is measured again for the scrape; an engine's statistics
		// may move in between (InnoDB's), so either reading will do.
		metric := dbSizeMetric(t, reg)
		if after := status(); metric != before.DbSize && metric != after.DbSize {
			t.Errorf("etcd_mvcc_db_total_size_in_bytes = %d, Status says DbSize %d then %d", metric, before.DbSize, after.DbSize)
		}
	}

	val := []byte(strings.Repeat("b", 4096))
	n := 0
	for ; !a.PutRefusedKey(t, ctx, fmt.Sprintf("fill/%05d", n), val); n++ {
		if n == 20000 {
			t.Fatalf("%d puts of 4 KiB fit under a quota of %d bytes", n, srv.quota)
		}
	}
	t.Logf("refused after %d puts of 4 KiB (DbSize %d before them, quota %d)", n, before.DbSize, srv.quota)
	ctl := func(args ...string) (string, error) {
		t.Helper()
		return etcdtest.Etcdctl(t, append([]string{"--endpoints=" + srv.Endpoint}, args...)...)
	}
	line := "memberID:" + strconv.FormatUint(a.Self, 10) + " alarm:NOSPACE"
	if out, err := ctl("alarm", "list"); err != nil || strings.TrimSpace(out) != line {
		t.Errorf("etcdctl alarm list: %q, %v; want %q", out, err, line)
	}
	if out, err := ctl("endpoint", "status", "-w", "fields"); err != nil || !strings.Contains(out, `"Errors" : [`+line+" ]") ||
		!strings.Contains(out, `"DBSizeQuota" : `+strconv.FormatInt(srv.quota, 10)) {
		t.Errorf("etcdctl endpoint status shows no alarm (%v):\n%s", err, out)
	}
	if out, err := ctl("put", "k", "v"); err == nil || !strings.Contains(err.Error(), "Error: etcdserver: mvcc: database space exceeded") {
		t.Errorf("etcdctl put under NOSPACE: %v\n%s", err, out)
	}
	return a
}

// dbSizeMetric returns etcd_mvcc_db_total_size_in_bytes from reg, failing
// t when it is absent.
func dbSizeMetric(t testing.TB, reg prometheus.Gatherer) int64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "etcd_mvcc_db_total_size_in_bytes" && len(f.GetMetric()) == 1 {
			return int64(f.GetMetric()[0].GetGauge().GetValue())
		}
	}
	t.Fatal("etcd_mvcc_db_total_size_in_bytes is not registered")
	return 0
}

// Etcdctl runs etcdctl 3.6 against srv and returns its output, failing t
// when it fails.
func (s *Server) Etcdctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := etcdtest.Etcdctl(t, append([]string{"--endpoints=" + s.Endpoint}, args...)...)
	if err != nil {
		t.Fatalf("etcdctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// DisarmNoSpace ends CheckSpace's round once the caller made room: `etcdctl
// alarm disarm` clears the NOSPACE alarm a's member raised, `alarm list` is
// then empty and `etcdctl put` works again.
func DisarmNoSpace(t testing.TB, srv *Server, a AlarmClient) {
	t.Helper()
	line := "memberID:" + strconv.FormatUint(a.Self, 10) + " alarm:NOSPACE"
	if out := srv.Etcdctl(t, "alarm", "disarm"); strings.TrimSpace(out) != line {
		t.Errorf("etcdctl alarm disarm: %q, want %q", out, line)
	}
	if out := srv.Etcdctl(t, "alarm", "list"); strings.TrimSpace(out) != "" {
		t.Errorf("etcdctl alarm list after disarm: %q", out)
	}
	if out := srv.Etcdctl(t, "put", "k", "v"); strings.TrimSpace(out) != "OK" {
		t.Errorf("etcdctl put after disarm: %q", out)
	}
}

// SpaceRound serves s with a quota of quota bytes and runs the operator's
// round on its space (CheckSpace: DbSize, the size metric, the
// NOSPACE alarm through etcdctl), then `etcdctl defrag`, which must
// succeed and reach the engine's reclamation: reclaims counts what the
// engine did, and must have grown.
func SpaceRound(t testing.TB, s kv.Store, quota int64, reclaims func() int64) {
	t.Helper()
	etcdtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
	defer cancel()
	reg := prometheus.NewRegistry()
	srv := Start(t, s, Options{QuotaBackendBytes: quota, Registerer: reg})
	CheckSpace(t, ctx, srv, reg)
	before := reclaims()
	if out, err := etcdtest.Etcdctl(t, "--endpoints="+srv.Endpoint, "defrag"); err != nil || !strings.Contains(out, "Finished defragmenting etcd member") {
		t.Fatalf("etcdctl defrag: %v\n%s", err, out)
	}
	if after := reclaims(); after <= before {
		t.Errorf("etcdctl defrag did not reach the engine's reclamation: %d before, %d after", before, after)
	}
}
