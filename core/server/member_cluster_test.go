package server_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/internal/etcdapi"
	"github.com/engramkv/engram/core/kv"
	"github.com/engramkv/engram/core/kv/kvfault"
	"github.com/engramkv/engram/core/server/servertest"
)

// join starts one more node over the cluster's store, serving on ln, and
// returns its index.
func (c *cluster) join(name string, ln net.Listener) int {
	c.t.Helper()
	st := kvfault.Wrap(c.shared)
	c.stores = append(c.stores, st)
	return c.add(name, st, servertest.Options{Listener: ln})
}

// startFollowed starts three nodes and returns them once node l leads
// and node f follows it, with a context for the test's calls.
func startFollowed(t *testing.T) (c *cluster, l, f int, ctx context.Context) {
	c = startCluster(t, 3)
	l = c.leader(-1)
	f = (l + 1) % 3
	c.following(f, l)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	t.Cleanup(cancel)
	return c, l, f, ctx
}

// listen opens a listener for a node that starts later, and its URL.
func listen(t *testing.T) (net.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln, "http://" + ln.Addr().String()
}

// wantErr checks that err is etcd's error want (compared by its text, as
// clients compare them).
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if err == nil || rpctypes.ErrorDesc(err) != rpctypes.ErrorDesc(want) {
		t.Errorf("%s: %v, want %v", what, err, want)
	}
}

func memberOf(members []*pb.Member, id uint64) *pb.Member {
	i := slices.IndexFunc(members, func(m *pb.Member) bool { return m.ID == id })
	if i < 0 {
		return nil
	}
	return members[i]
}

// TestClusterLearner: a learner added through a follower is listed
// unstarted; the node that starts at its peer URL takes its ID, serves
// Status and serializable reads and refuses the rest as etcd's learner
// does, and is never elected; promoted, it serves as a follower and can
// lead. Each refusal along the way is etcd's.
func TestClusterLearner(t *testing.T) {
	t.Parallel()
	c, l, f, ctx := startFollowed(t)
	fc := c.client(f)
	ln, url := listen(t)

	add, err := fc.MemberAddAsLearner(ctx, []string{url})
	if err != nil {
		t.Fatal(err)
	}
	id := add.Member.ID
	if !add.Member.IsLearner || add.Member.Name != "" || !slices.Equal(add.Member.PeerURLs, []string{url}) {
		t.Fatalf("added %+v", add.Member)
	}
	if m := memberOf(add.Members, id); m == nil || m.Name != "" || len(m.ClientURLs) != 0 || len(add.Members) != 4 {
		t.Fatalf("members after the add: %+v", add.Members)
	}

	voter := etcdapi.MemberID(c.names[f])
	_, err = fc.MemberAdd(ctx, []string{url})
	wantErr(t, "adding the same peer URL", err, rpctypes.ErrGRPCPeerURLExist)
	_, err = fc.MemberAdd(ctx, []string{"http://" + c.nodes[l].Endpoint})
	wantErr(t, "adding a running member's URL", err, rpctypes.ErrGRPCPeerURLExist)
	_, err = fc.MemberAddAsLearner(ctx, []string{"http://127.0.0.1:1"})
	wantErr(t, "a second learner", err, rpctypes.ErrGRPCTooManyLearners)
	// etcd's client checks URLs too; the server must not count on it.
	raw := pb.NewClusterClient(fc.ActiveConnection())
	_, err = raw.MemberAdd(ctx, &pb.MemberAddRequest{PeerURLs: []string{"127.0.0.1:1"}})
	wantErr(t, "a URL without a scheme", err, rpctypes.ErrGRPCMemberBadURLs)
	_, err = raw.MemberAdd(ctx, &pb.MemberAddRequest{})
	wantErr(t, "no URL", err, rpctypes.ErrGRPCMemberBadURLs)
	_, err = raw.MemberUpdate(ctx, &pb.MemberUpdateRequest{ID: voter, PeerURLs: []string{"ftp://127.0.0.1:1"}})
	wantErr(t, "updating to a URL of another scheme", err, rpctypes.ErrGRPCMemberBadURLs)
	_, err = fc.MemberPromote(ctx, id)
	wantErr(t, "promoting a learner not started", err, rpctypes.ErrGRPCLearnerNotReady)
	_, err = fc.MemberPromote(ctx, voter)
	wantErr(t, "promoting a voting member", err, rpctypes.ErrGRPCMemberNotLearner)
	_, err = fc.MemberPromote(ctx, 0x1234)
	wantErr(t, "promoting an unknown member", err, rpctypes.ErrGRPCMemberNotFound)
	_, err = fc.MemberUpdate(ctx, 0x1234, []string{"http://127.0.0.1:2"})
	wantErr(t, "updating an unknown member", err, rpctypes.ErrGRPCMemberNotFound)
	_, err = c.client(l).MoveLeader(ctx, id)
	wantErr(t, "moving leadership to a learner", err, rpctypes.ErrGRPCBadLeaderTransferee)

	ln3 := c.join("learner", ln)
	c.following(ln3, l)
	lc := c.client(ln3)
	st, err := lc.Status(ctx, c.nodes[ln3].Endpoint)
	if err != nil || st.Header.MemberId != id || !st.IsLearner || st.Leader != etcdapi.MemberID(c.names[l]) {
		t.Fatalf("the learner's status: %+v %v (want member %x, leader %x)", st, err, id, etcdapi.MemberID(c.names[l]))
	}
	if _, err := fc.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	if g, err := lc.Get(ctx, "k", clientv3.WithSerializable()); err != nil || len(g.Kvs) != 1 {
		t.Fatalf("a serializable read on the learner: %+v %v", g, err)
	}
	_, err = lc.Get(ctx, "k")
	wantErr(t, "a linearizable read on the learner", err, rpctypes.ErrGRPCNotSupportedForLearner)
	_, err = lc.Put(ctx, "k", "w")
	wantErr(t, "a write on the learner", err, rpctypes.ErrGRPCNotSupportedForLearner)
	_, err = lc.MemberList(ctx)
	wantErr(t, "member list on the learner", err, rpctypes.ErrGRPCNotSupportedForLearner)
	ml, err := c.client(l).MemberList(ctx)
	if m := memberOf(ml.Members, id); err != nil || m == nil || m.Name != "learner" || !m.IsLearner || !slices.Equal(m.ClientURLs, []string{url}) {
		t.Fatalf("member list with the learner started: %+v %v", ml, err)
	}

	c.nodes[l].Kill()
	nl := c.leader(l)
	if nl == ln3 {
		t.Fatal("the learner was elected")
	}
	c.following(ln3, nl)
	c.following(f, nl)

	if _, err := fc.MemberPromote(ctx, id); err != nil {
		t.Fatalf("promote: %v", err)
	}
	st, err = lc.Status(ctx, c.nodes[ln3].Endpoint)
	if err != nil || st.IsLearner {
		t.Fatalf("status once promoted: %+v %v", st, err)
	}
	if _, err := lc.Put(ctx, "k", "promoted"); err != nil {
		t.Fatalf("a write through the promoted member: %v", err)
	}
	if _, err := c.client(nl).MoveLeader(ctx, id); err != nil {
		t.Fatalf("moving leadership to the promoted member: %v", err)
	}
	c.await("the promoted member leading", c.nodes[ln3].IsLeader)
	c.following(f, ln3)
	if st, err := fc.Status(ctx, c.nodes[f].Endpoint); err != nil || st.Leader != id {
		t.Fatalf("a follower's status: %+v %v; want the added member's ID %x as leader", st, err, id)
	}
	_, err = fc.MemberPromote(ctx, id)
	wantErr(t, "promoting it again", err, rpctypes.ErrGRPCMemberNotLearner)
}

// TestClusterMemberUpdateAndRemove: member update moves a member's peer
// URL (here to another name of the same listener), which followers then
// forward to and which the member keeps across a restart; a pending
// member can be updated and removed; a stopped member is removed.
func TestClusterMemberUpdateAndRemove(t *testing.T) {
	t.Parallel()
	c, l, f, ctx := startFollowed(t)
	fc := c.client(f)
	lid := etcdapi.MemberID(c.names[l])
	moved := "http://" + strings.Replace(c.nodes[l].Endpoint, "127.0.0.1", "localhost", 1)

	up, err := fc.MemberUpdate(ctx, lid, []string{moved})
	if err != nil {
		t.Fatal(err)
	}
	if m := memberOf(up.Members, lid); m == nil || !slices.Equal(m.PeerURLs, []string{moved}) || m.Name != c.names[l] {
		t.Fatalf("members after the update: %+v", up.Members)
	}
	_, err = fc.MemberUpdate(ctx, etcdapi.MemberID(c.names[f]), []string{moved})
	wantErr(t, "taking another member's peer URL", err, rpctypes.ErrGRPCPeerURLExist)
	if _, err := fc.Put(ctx, "after-update", "v"); err != nil {
		t.Fatalf("a write forwarded after the update: %v", err)
	}

	// A pending member: updated, then removed.
	add, err := fc.MemberAdd(ctx, []string{"http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fc.MemberUpdate(ctx, add.Member.ID, []string{"http://127.0.0.1:2"}); err != nil {
		t.Fatalf("updating a pending member: %v", err)
	}
	ml, err := fc.MemberList(ctx)
	if m := memberOf(ml.Members, add.Member.ID); err != nil || m == nil || !slices.Equal(m.PeerURLs, []string{"http://127.0.0.1:2"}) || m.IsLearner {
		t.Fatalf("the pending member after its update: %+v %v", ml, err)
	}
	rm, err := fc.MemberRemove(ctx, add.Member.ID)
	if err != nil || memberOf(rm.Members, add.Member.ID) != nil || len(rm.Members) != 3 {
		t.Fatalf("removing the pending member: %+v %v", rm, err)
	}

	// The updated peer URL is the member's own, across its restart; the
	// member keeps its ID. A stopped member is then removed.
	gone := (l + 2) % 3
	gid := etcdapi.MemberID(c.names[gone])
	other := "http://" + strings.Replace(c.nodes[gone].Endpoint, "127.0.0.1", "localhost", 1)
	if _, err := fc.MemberUpdate(ctx, gid, []string{other}); err != nil {
		t.Fatal(err)
	}
	c.nodes[gone].Stop()
	ln, _ := listen(t)
	again := c.join(c.names[gone], ln)
	ml, err = c.client(again).MemberList(ctx)
	if m := memberOf(ml.Members, gid); err != nil || m == nil || !slices.Equal(m.PeerURLs, []string{other}) {
		t.Fatalf("member list after the updated member restarted: %+v %v", ml, err)
	}
	c.nodes[again].Stop()
	rm, err = fc.MemberRemove(ctx, gid)
	if err != nil || memberOf(rm.Members, gid) != nil || len(rm.Members) != 2 {
		t.Fatalf("removing the stopped member: %+v %v", rm, err)
	}
}

// TestClusterMemberClaim: a voting member added for a URL is claimed by
// the node that starts there, which can then lead; its member/ record
// keeps the format v0.9.0 nodes read. A learner whose promotion's wake-up
// was lost reads its record again before it refuses a request.
func TestClusterMemberClaim(t *testing.T) {
	t.Parallel()
	c, l, f, ctx := startFollowed(t)
	fc := c.client(f)
	ln, url := listen(t)
	add, err := fc.MemberAdd(ctx, []string{url})
	if err != nil {
		t.Fatal(err)
	}
	id := add.Member.ID
	voter := c.join("voter", ln)
	c.following(voter, l)
	st, err := fc.Status(ctx, c.nodes[voter].Endpoint)
	if err != nil || st.Header.MemberId != id || st.IsLearner {
		t.Fatalf("the added voting member's status: %+v %v, want member %x", st, err, id)
	}
	raw, err := c.shared.Get(ctx, coder.MetaKey("member/voter"))
	if err != nil || string(raw) != url {
		t.Fatalf("member/voter holds %q (%v), want its client URL as v0.9.0 wrote it", raw, err)
	}
	if _, err := c.client(l).MoveLeader(ctx, id); err != nil {
		t.Fatalf("moving leadership to the added member: %v", err)
	}
	c.await("the added member leading", c.nodes[voter].IsLeader)

	ln, url = listen(t)
	add, err = fc.MemberAddAsLearner(ctx, []string{url})
	if err != nil {
		t.Fatal(err)
	}
	learner := c.join("learner", ln)
	c.following(learner, voter)
	lc := c.client(learner)
	_, err = lc.Put(ctx, "k", "v")
	wantErr(t, "a write on the learner", err, rpctypes.ErrGRPCNotSupportedForLearner)
	// A promotion whose wake-up never arrived: the record changes, nothing
	// tells the node.
	key := coder.MetaKey("memberattr/learner")
	cur, err := c.shared.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	promoted := strings.Replace(string(cur), `"learner":true`, "", 1)
	promoted = strings.Replace(promoted, ",}", "}", 1)
	if promoted == string(cur) {
		t.Fatalf("unexpected record %s", cur)
	}
	if err := c.shared.Commit(ctx, []kv.Op{kv.CompareAndSwap(key, cur, []byte(promoted))}); err != nil {
		t.Fatal(err)
	}
	if _, err := lc.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("a write on the learner promoted behind its back: %v", err)
	}
}
