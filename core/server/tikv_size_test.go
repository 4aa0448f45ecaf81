package server_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/internal/clock/fakeclock"
	"github.com/engramkv/engram/core/server"
	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/tikv"
	"github.com/engramkv/engram/engines/tikv/tikvmock"
	"github.com/engramkv/engram/internal/etcdtest"
)

// openTiKVMock opens the TiKV adaptor on a fresh mock cluster whose size
// (the mock's exact bytes) is read by clock, closed at cleanup.
func openTiKVMock(t *testing.T, clock func() time.Time) *tikv.Store {
	t.Helper()
	s, err := tikvmock.Open(tikvmock.Options{Store: tikv.Options{Clock: clock}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestTiKVSizeStatusAndMetrics: on TiKV (the mock), Status reports the
// namespace's size, which grows with writes once the adaptor's one-second
// reuse of a measure has passed, and etcd_mvcc_db_total_size_in_bytes (and
// _in_use_) report the same number.
func TestTiKVSizeStatusAndMetrics(t *testing.T) {
	t.Parallel()
	clock := fakeclock.New(t, time.Unix(1_000_000, 0))
	n := startMetricsNode(t, server.Options{Store: openTiKVMock(t, clock.Now), Name: "tikv"})
	first := dbSize(t, n.endpoint)
	if first <= 0 {
		t.Fatalf("Status DbSize %d on a started server, want its metadata's size", first)
	}
	exercise(t, n.endpoint)
	if got := dbSize(t, n.endpoint); got != first {
		t.Errorf("DbSize %d within a second of the measure %d: the measure was not reused", got, first)
	}
	clock.Advance(time.Second)
	grown := dbSize(t, n.endpoint)
	if grown <= first {
		t.Errorf("DbSize %d after writes, was %d", grown, first)
	}
	fams := scrape(t, n.url)
	for _, name := range []string{"etcd_mvcc_db_total_size_in_bytes", "etcd_mvcc_db_total_size_in_use_in_bytes"} {
		f, ok := fams[name]
		if !ok {
			t.Errorf("%s: missing", name)
			continue
		}
		if v := f.GetMetric()[0].GetGauge().GetValue(); v != float64(grown) {
			t.Errorf("%s %v, Status says %d", name, v, grown)
		}
	}
}

// tickingClock is a clock every reading of which is a second after the
// previous one: an adaptor reading it never reuses a measure of its size,
// so the quota and Status see the mock's exact size at once.
func tickingClock() func() time.Time {
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Second)
		return now
	}
}

// TestAlarmEtcdctlTiKV is the operator's round with etcdctl 3.6 on Engram
// over TiKV (the mock): writes until the quota refuses one and NOSPACE is
// raised as on badger (servertest.CheckSpace); `defrag` succeeds under the alarm
// (TiKV reclaims space by itself, after its GC, so it gives nothing back
// now); the operator raises the quota and restarts, the alarm is still
// there until `alarm disarm`, and then `put` works again.
func TestAlarmEtcdctlTiKV(t *testing.T) {
	t.Parallel()
	etcdtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
	defer cancel()
	store := openTiKVMock(t, tickingClock())
	const quota = 2 << 20
	srv := servertest.Start(t, store, servertest.Options{QuotaBackendBytes: quota})
	a := servertest.CheckSpace(t, ctx, srv, nil)
	if st, err := a.Maint.Status(ctx, &pb.StatusRequest{}); err != nil || st.DbSize < quota/2 {
		t.Fatalf("Status when refused: DbSize %d of a %d quota (%v)", st.GetDbSize(), quota, err)
	}
	if out := srv.Etcdctl(t, "defrag"); !strings.HasPrefix(defragLine(out), "Finished defragmenting etcd member[EP]") {
		t.Errorf("etcdctl defrag: %q", out)
	}

	srv.Stop()
	srv = servertest.Start(t, store, servertest.Options{QuotaBackendBytes: 2 * quota})
	a = servertest.NewAlarmClient(t, ctx, srv.Client(t))
	if got := a.Alarm(t, ctx, pb.AlarmRequest_GET, 0); !servertest.HoldsNoSpace(got, a.Self) {
		t.Fatalf("after the restart with a larger quota the alarms are %v, want NOSPACE", got)
	}
	if !a.PutRefused(t, ctx) {
		t.Fatal("a put is accepted under NOSPACE after the restart")
	}
	servertest.DisarmNoSpace(t, srv, a)
}
