package server_test

import (
	"context"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/engramkv/engram/core/server/servertest"
	"github.com/engramkv/engram/engines/badger"
	"github.com/engramkv/engram/internal/etcdtest"
)

// TestAlarmEtcdctlBadger is the operator's round with etcdctl 3.6 on
// Engram over badger, its default engine: writes until the quota refuses
// one, `alarm list` and `endpoint status` show NOSPACE in etcd's words
// (servertest.CheckSpace, which the wasm engines' tests run too), and after deleting, compacting and `defrag` (badger gives the space
// back) `alarm disarm` clears it and `put` works again.
func TestAlarmEtcdctlBadger(t *testing.T) {
	t.Parallel()
	etcdtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
	defer cancel()
	bs, err := badger.Open(badger.Options{Dir: t.TempDir(), GCInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bs.Close() })
	const quota = 4 << 20
	srv := servertest.Start(t, bs, servertest.Options{QuotaBackendBytes: quota})
	a := servertest.CheckSpace(t, ctx, srv, nil)

	// The refusal rests on the engine's own measure, not only on the
	// quota's running count of admitted writes.
	if st, err := a.Maint.Status(ctx, &pb.StatusRequest{}); err != nil || st.DbSize < quota/2 {
		t.Fatalf("Status when refused: DbSize %d of a %d quota (%v)", st.GetDbSize(), quota, err)
	}
	del, err := a.KV.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("fill/"), RangeEnd: []byte("fill0")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.KV.Compact(ctx, &pb.CompactionRequest{Revision: del.Header.Revision, Physical: true}); err != nil {
		t.Fatal(err)
	}
	srv.Etcdctl(t, "defrag")
	st, err := a.Maint.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after defrag: DbSize %d of a %d quota", st.DbSize, st.DbSizeQuota)
	servertest.DisarmNoSpace(t, srv, a)
}
