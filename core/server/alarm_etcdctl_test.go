package server_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/internal/etcdtest"
	"github.com/engramkv/engram/plugins/badger"
)

// TestAlarmEtcdctlBadger is the operator's round with etcdctl 3.6 on
// Engram over badger, its default engine: writes until the quota refuses
// one, `alarm list` and `endpoint status` show NOSPACE in etcd's words,
// and after deleting, compacting and `defrag` (badger gives the space
// back) `alarm disarm` clears it and `put` works again.
func TestAlarmEtcdctlBadger(t *testing.T) {
	etcdtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
	defer cancel()
	bs, err := badger.Open(badger.Options{Dir: t.TempDir(), GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bs.Close() })
	const quota = 4 << 20
	srv := servertest.Start(t, servertest.Options{Store: bs, QuotaBackendBytes: quota})
	a := newAlarmClient(t, ctx, srv.Client(t))
	ctl := etcdctlAt(t, srv.Endpoint)
	line := fillToNoSpace(t, ctx, a, srv.Endpoint, quota)

	del, err := a.kv.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("fill/"), RangeEnd: []byte("fill0")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.kv.Compact(ctx, &pb.CompactionRequest{Revision: del.Header.Revision, Physical: true}); err != nil {
		t.Fatal(err)
	}
	ctl("defrag")
	st, err := a.maint.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after defrag: DbSize %d of a %d quota", st.DbSize, st.DbSizeQuota)
	disarmAndPut(t, ctl, line)
}

// disarmAndPut runs `alarm disarm`, which must clear the alarm of line,
// and checks that `put` works again.
func disarmAndPut(t *testing.T, ctl func(args ...string) string, line string) {
	t.Helper()
	if out := ctl("alarm", "disarm"); strings.TrimSpace(out) != line {
		t.Errorf("etcdctl alarm disarm: %q, want %q", out, line)
	}
	if out := ctl("alarm", "list"); strings.TrimSpace(out) != "" {
		t.Errorf("etcdctl alarm list after disarm: %q", out)
	}
	if out := ctl("put", "k", "v"); strings.TrimSpace(out) != "OK" {
		t.Errorf("etcdctl put after disarm: %q", out)
	}
}

// etcdctlAt returns etcdctl 3.6 on endpoint, failing t when it fails.
func etcdctlAt(t *testing.T, endpoint string) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		out, err := etcdtest.Etcdctl(t, append([]string{"--endpoints=" + endpoint}, args...)...)
		if err != nil {
			t.Fatalf("etcdctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
}

// fillToNoSpace puts 4 KiB values through a until the quota refuses one,
// then checks what an operator sees with etcdctl: `alarm list` and
// `endpoint status` show NOSPACE in etcd's words and `put` is refused with
// etcd's error. The refusal must rest on the engine's own measure, not
// only on the quota's running count of admitted writes: Status then
// reports at least half the quota. It returns `alarm list`'s line.
func fillToNoSpace(t *testing.T, ctx context.Context, a alarmClient, endpoint string, quota int64) string {
	t.Helper()
	ctl := etcdctlAt(t, endpoint)
	val := []byte(strings.Repeat("b", 4096))
	n := 0
	for ; !a.putRefusedKey(t, ctx, fmt.Sprintf("fill/%05d", n), val); n++ {
		if n == 20000 {
			t.Fatalf("%d puts of 4 KiB fit under a quota of %d bytes", n, quota)
		}
	}
	t.Logf("refused after %d puts of 4 KiB", n)
	line := "memberID:" + strconv.FormatUint(a.self, 10) + " alarm:NOSPACE"
	if out := ctl("alarm", "list"); strings.TrimSpace(out) != line {
		t.Errorf("etcdctl alarm list: %q, want %q", out, line)
	}
	if out := ctl("endpoint", "status", "-w", "fields"); !strings.Contains(out, `"Errors" : [`+line+" ]") || !strings.Contains(out, `"DBSizeQuota" : `+strconv.FormatInt(quota, 10)) {
		t.Errorf("etcdctl endpoint status shows no alarm:\n%s", out)
	}
	if out, err := etcdtest.Etcdctl(t, "--endpoints="+endpoint, "put", "k", "v"); err == nil || !strings.Contains(err.Error(), "Error: etcdserver: mvcc: database space exceeded") {
		t.Errorf("etcdctl put under NOSPACE: %v\n%s", err, out)
	}
	if st, err := a.maint.Status(ctx, &pb.StatusRequest{}); err != nil || st.DbSize < quota/2 {
		t.Fatalf("Status when refused: DbSize %d of a %d quota (%v)", st.GetDbSize(), quota, err)
	}
	return line
}

// putRefusedKey is putRefused for a given key and value.
func (a alarmClient) putRefusedKey(t *testing.T, ctx context.Context, key string, val []byte) bool {
	t.Helper()
	_, err := a.kv.Put(ctx, &pb.PutRequest{Key: []byte(key), Value: val})
	return err != nil && a.refusal(t, err)
}
