package server

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/internal/clock/fakeclock"
	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/internal/etcdapi"
	"github.com/engramkv/engram/core/kv"
	release "github.com/engramkv/engram/core/version"
	"github.com/engramkv/engram/engines/memkv"
)

var v010 = release.Version{Major: 0, Minor: 10}

// newMember starts a cluster member over st without a gRPC listener: the
// cluster version and the downgrade records need only the store. Its clock
// is a fake one that never moves: these tests need no election round after
// the first.
func newMember(t *testing.T, st kv.Store, name string) *Server {
	t.Helper()
	s, err := New(context.Background(), Options{Store: st, Name: name, AdvertiseClientURLs: []string{"http://127.0.0.1:1"},
		Clock:   fakeclock.New(t, time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)),
		Cluster: ClusterOptions{Enabled: true, LeaseDuration: time.Second, RenewInterval: 250 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func wantCluster(t *testing.T, s *Server, want string) clusterVersion {
	t.Helper()
	cv, err := s.clusterVersion(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := cv.inForce.Cluster(); got != want {
		t.Fatalf("cluster version %s, want %s (members %s, oldest %q)", got, want, cv.members.Cluster(), cv.oldest)
	}
	return cv
}

func wantRefused(t *testing.T, err error, mentions string) {
	t.Helper()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), mentions) {
		t.Fatalf("gate answered %v; want FailedPrecondition mentioning %q", err, mentions)
	}
}

// TestClusterVersionGate: a member registered without a version record (as
// 0.9.0 registers) holds the cluster version at 0.9 and the gate names it;
// once it is gone the cluster runs at 0.10; a member that stops keeps its
// record and counts as the release it last published.
func TestClusterVersionGate(t *testing.T) {
	ctx := context.Background()
	st := memkv.New()
	a := newMember(t, st, "a")
	b := newMember(t, st, "b")
	wantCluster(t, a, "0.10")
	if err := a.requireClusterVersion(ctx, "feature x", v010); err != nil {
		t.Fatalf("gate with every member at 0.10: %v", err)
	}
	old := coder.MetaKey(memberPrefix + "old")
	if err := st.Commit(ctx, []kv.Op{kv.Put(old, []byte("http://127.0.0.1:2"))}); err != nil {
		t.Fatal(err)
	}
	cv := wantCluster(t, b, "0.9")
	if cv.oldest != "old" {
		t.Errorf("oldest member %q, want old", cv.oldest)
	}
	wantRefused(t, b.requireClusterVersion(ctx, "feature x", v010), `member "old" runs 0.9`)
	if err := b.requireClusterVersion(ctx, "feature y", release.Version{Major: 0, Minor: 9}); err != nil {
		t.Errorf("a 0.9 feature with a 0.9 member: %v", err)
	}
	// The member commands' records are such a feature: a 0.9 member would
	// let a learner campaign.
	_, _, err := membership{b}.AddMember(ctx, []string{"http://127.0.0.1:3"}, true)
	wantRefused(t, err, `member add needs cluster version 0.10; member "old" runs 0.9`)
	if err := st.Commit(ctx, []kv.Op{kv.Delete(old)}); err != nil {
		t.Fatal(err)
	}
	wantCluster(t, b, "0.10")

	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, coder.MetaKey(memberVersionPrefix+"a")); err != nil {
		t.Fatalf("a stopped member's version record: %v, want it kept", err)
	}
	wantCluster(t, b, "0.10")
	// Its record says 0.9 (as an older release would have left it): the
	// stopped member counts as that.
	raw, _ := json.Marshal(memberVersion{Version: "0.9.0", StorageFormat: 2, OldestStorageFormat: 1})
	if err := st.Commit(ctx, []kv.Op{kv.Put(coder.MetaKey(memberVersionPrefix+"a"), raw)}); err != nil {
		t.Fatal(err)
	}
	if cv := wantCluster(t, b, "0.9"); cv.oldest != "a" {
		t.Errorf("oldest member %q, want the stopped a", cv.oldest)
	}
	newMember(t, st, "a")
	wantCluster(t, b, "0.10")
}

// TestDowngradeActions: the Downgrade RPC's actions and refusals on a
// cluster all at 0.10, and what ENABLE does to the gate and to the other
// member.
func TestDowngradeActions(t *testing.T) {
	ctx := context.Background()
	st := memkv.New()
	a, b := newMember(t, st, "a"), newMember(t, st, "b")
	d := downgrader{a}
	call := func(action pb.DowngradeRequest_DowngradeAction, v string) (string, error) {
		r, err := d.Downgrade(ctx, &pb.DowngradeRequest{Action: action, Version: v})
		if err != nil {
			return "", err
		}
		return r.Version, nil
	}
	for _, c := range []struct {
		action pb.DowngradeRequest_DowngradeAction
		v      string
		want   string
		err    error
	}{
		{pb.DowngradeRequest_VALIDATE, "0.9", "0.10", nil},
		{pb.DowngradeRequest_VALIDATE, "0.9.7", "0.10", nil},
		{pb.DowngradeRequest_VALIDATE, "0.9.0-rc.1", "0.10", nil},
		{pb.DowngradeRequest_VALIDATE, "0.8", "", rpctypes.ErrGRPCInvalidDowngradeTargetVersion},
		{pb.DowngradeRequest_VALIDATE, "0.10", "", rpctypes.ErrGRPCInvalidDowngradeTargetVersion},
		{pb.DowngradeRequest_VALIDATE, "1.9", "", rpctypes.ErrGRPCInvalidDowngradeTargetVersion},
		{pb.DowngradeRequest_VALIDATE, "v0.9", "", rpctypes.ErrGRPCWrongDowngradeVersionFormat},
		{pb.DowngradeRequest_VALIDATE, "", "", rpctypes.ErrGRPCWrongDowngradeVersionFormat},
		{pb.DowngradeRequest_ENABLE, "nine", "", rpctypes.ErrGRPCWrongDowngradeVersionFormat},
		{pb.DowngradeRequest_ENABLE, "0.8", "", rpctypes.ErrGRPCInvalidDowngradeTargetVersion},
		{pb.DowngradeRequest_CANCEL, "", "0.10", nil}, // nothing to cancel: etcd 3.6 answers success
		{pb.DowngradeRequest_DowngradeAction(7), "0.9", "", errUnknownMethod},
	} {
		got, err := call(c.action, c.v)
		if !errors.Is(err, c.err) || got != c.want {
			t.Errorf("%v %q: %q, %v; want %q, %v", c.action, c.v, got, err, c.want, c.err)
		}
	}
	if info := d.DowngradeInfo(ctx); info.Enabled {
		t.Fatalf("downgrade info before ENABLE: %+v", info)
	}

	if got, err := call(pb.DowngradeRequest_ENABLE, "0.9"); err != nil || got != "0.10" {
		t.Fatalf("ENABLE 0.9: %q, %v", got, err)
	}
	// Every member sees it: the other one's gate refuses 0.10 features.
	wantCluster(t, b, "0.9")
	wantRefused(t, b.requireClusterVersion(ctx, "feature x", v010), "a downgrade to 0.9 is enabled")
	if info := (downgrader{b}).DowngradeInfo(ctx); !info.Enabled || info.TargetVersion != "0.9.0" {
		t.Errorf("downgrade info on the other member: %+v", info)
	}
	if _, err := call(pb.DowngradeRequest_ENABLE, "0.9"); !errors.Is(err, rpctypes.ErrGRPCDowngradeInProcess) {
		t.Errorf("ENABLE again: %v, want %v", err, rpctypes.ErrGRPCDowngradeInProcess)
	}
	if _, err := call(pb.DowngradeRequest_VALIDATE, "0.9"); !errors.Is(err, rpctypes.ErrGRPCDowngradeInProcess) {
		t.Errorf("VALIDATE during a downgrade: %v, want %v", err, rpctypes.ErrGRPCDowngradeInProcess)
	}
	// A restarted member still sees it.
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	wantCluster(t, newMember(t, st, "b"), "0.9")

	if got, err := (downgrader{b}).Downgrade(ctx, &pb.DowngradeRequest{Action: pb.DowngradeRequest_CANCEL}); err != nil || got.Version != "0.10" {
		t.Fatalf("CANCEL: %v, %v", got, err)
	}
	wantCluster(t, a, "0.10")
	if err := a.requireClusterVersion(ctx, "feature x", v010); err != nil {
		t.Errorf("gate after CANCEL: %v", err)
	}
}

// TestDowngradeBlockers: ENABLE is refused while the members write a
// storage format the target does not read, or while the store holds a
// feature newer than the target; a feature as old as the target, or absent,
// does not block.
func TestDowngradeBlockers(t *testing.T) {
	ctx := context.Background()
	target := release.Known{Version: release.Version{Major: 0, Minor: 9}, Writes: 2, Reads: 1}
	feature := func(name string, since release.Version, there bool, err error) storedFeature {
		return storedFeature{name: name, since: since, present: func(context.Context, kv.Store) (bool, error) { return there, err }}
	}
	broken := errors.New("store down")
	for _, c := range []struct {
		name     string
		format   int
		features []storedFeature
		mentions string // "" when allowed
	}{
		{name: "nothing newer", format: 2},
		{name: "newer format", format: 3, mentions: "storage format 3"},
		{name: "older format", format: 1},
		{name: "newer feature present", format: 2, features: []storedFeature{feature("learner records", v010, true, nil)}, mentions: "learner records, which needs 0.10"},
		{name: "newer feature absent", format: 2, features: []storedFeature{feature("learner records", v010, false, nil)}},
		{name: "feature as old as the target", format: 2, features: []storedFeature{feature("old records", target.Version, true, nil)}},
		{name: "second feature present", format: 2, features: []storedFeature{feature("a", v010, false, nil), feature("b", v010, true, nil)}, mentions: "holds b"},
		{name: "detector fails", format: 2, features: []storedFeature{feature("a", v010, false, broken)}, mentions: "store down"},
	} {
		err := downgradeBlockers(ctx, memkv.New(), target, c.format, c.features)
		switch {
		case c.mentions == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.mentions != "" && (err == nil || !strings.Contains(err.Error(), c.mentions)):
			t.Errorf("%s: %v, want a refusal mentioning %q", c.name, err, c.mentions)
		}
	}
	for _, f := range storedFeatures() {
		if f.present == nil || f.since.Less(release.Version{Major: 0, Minor: 10}) {
			t.Errorf("stored feature %q: no detector, or older than the first release that could list it", f.name)
		}
	}
}

// oldStatus answers Status as the member named id, with release in the
// response header ("": none, as 0.9.0 answers).
type oldStatus struct {
	pb.UnimplementedMaintenanceServer
	id      uint64
	release string
}

func (o oldStatus) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	if o.release != "" {
		_ = grpc.SetHeader(ctx, metadata.Pairs(etcdapi.ReleaseHeader, o.release))
	}
	return &pb.StatusResponse{Header: &pb.ResponseHeader{MemberId: o.id}}, nil
}

// serveStatus registers a member named name whose URL answers Status as
// oldStatus with release, and returns a func that stops it.
func serveStatus(t *testing.T, st kv.Store, name, release string, record []byte) func() {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	pb.RegisterMaintenanceServer(gs, oldStatus{id: etcdapi.MemberID(name), release: release})
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	ops := []kv.Op{kv.Put(coder.MetaKey(memberPrefix+name), []byte("http://"+lis.Addr().String()))}
	if record != nil {
		ops = append(ops, kv.Put(coder.MetaKey(memberVersionPrefix+name), record))
	}
	if err := st.Commit(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	return gs.Stop
}

// TestClusterVersionAsksRunningMembers: a member that answers is what it
// says, whatever its record: one answering without a release (0.9.0, here
// started where a killed 0.10 process left its record) holds the cluster
// at 0.9; once it no longer answers, its record speaks for it. A member
// answering a newer release does not hold the cluster back.
func TestClusterVersionAsksRunningMembers(t *testing.T) {
	st := memkv.New()
	a := newMember(t, st, "a")
	stale, err := json.Marshal(memberVersion{Version: "0.10.0", StorageFormat: 2, OldestStorageFormat: 1})
	if err != nil {
		t.Fatal(err)
	}
	stop := serveStatus(t, st, "old", "", stale)
	if cv := wantCluster(t, a, "0.9"); cv.oldest != "old" {
		t.Errorf("oldest member %q, want old", cv.oldest)
	}
	stop()
	wantCluster(t, a, "0.10")

	serveStatus(t, st, "newer", "0.11.0", nil)
	if cv := wantCluster(t, a, "0.10"); cv.oldest != "a" && cv.oldest != "old" {
		t.Errorf("oldest member %q; the 0.11 member cannot be the oldest", cv.oldest)
	}
}
