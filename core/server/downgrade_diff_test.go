package server_test

import (
	"fmt"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/server/servertest"
	release "github.com/engramkv/engram/core/version"
	"github.com/engramkv/engram/engines/memkv"
	"github.com/engramkv/engram/internal/etcdtest"
)

// TestDiffDowngrade: Downgrade on a one-member etcd 3.6 and on Engram. The
// versions differ (etcd's are 3.x, Engram's 0.x), so each case names a
// target by its place relative to the server's own version, and a success
// is compared as the server's cluster version in the answer; refusals must
// be the same code and message.
func TestDiffDowngrade(t *testing.T) {
	p, ctx := newPair(t)
	own := [2]release.Version{{Major: 3, Minor: 6}, release.Current().MajorMinor()}
	at := func(i, minorsDown int) string {
		return fmt.Sprintf("%d.%d", own[i].Major, own[i].Minor-minorsDown)
	}
	var maint [2]pb.MaintenanceClient
	for i := range 2 {
		maint[i] = pb.NewMaintenanceClient(p.conn[i])
	}
	show := func(i int) func(*pb.DowngradeResponse) string {
		return func(r *pb.DowngradeResponse) string {
			if r.Version == own[i].Cluster() {
				return "ok, cluster version: its own"
			}
			return "ok, cluster version " + r.Version
		}
	}
	cases := []struct {
		what    string
		action  pb.DowngradeRequest_DowngradeAction
		version func(i int) string
	}{
		{"validate one minor down", pb.DowngradeRequest_VALIDATE, func(i int) string { return at(i, 1) }},
		{"validate one minor down with a patch", pb.DowngradeRequest_VALIDATE, func(i int) string { return at(i, 1) + ".4" }},
		{"validate two minors down", pb.DowngradeRequest_VALIDATE, func(i int) string { return at(i, 2) }},
		{"validate its own version", pb.DowngradeRequest_VALIDATE, func(i int) string { return at(i, 0) }},
		{"validate a leading v", pb.DowngradeRequest_VALIDATE, func(i int) string { return "v" + at(i, 1) }},
		{"validate an empty version", pb.DowngradeRequest_VALIDATE, func(int) string { return "" }},
		{"validate a word", pb.DowngradeRequest_VALIDATE, func(int) string { return "latest" }},
		{"validate four numbers", pb.DowngradeRequest_VALIDATE, func(i int) string { return at(i, 1) + ".0.1" }},
		{"enable a bad version", pb.DowngradeRequest_ENABLE, func(int) string { return "x.y" }},
		{"enable two minors down", pb.DowngradeRequest_ENABLE, func(i int) string { return at(i, 2) }},
		{"cancel with nothing enabled", pb.DowngradeRequest_CANCEL, func(int) string { return "" }},
		{"an unknown action", pb.DowngradeRequest_DowngradeAction(9), func(i int) string { return at(i, 1) }},
		{"enable one minor down", pb.DowngradeRequest_ENABLE, func(i int) string { return at(i, 1) }},
	}
	for _, c := range cases {
		var got [2]string
		for i := range 2 {
			r, err := maint[i].Downgrade(ctx, &pb.DowngradeRequest{Action: c.action, Version: c.version(i)})
			if err != nil {
				st, _ := status.FromError(err)
				got[i] = fmt.Sprintf("error %s: %s", st.Code(), st.Message())
				continue
			}
			got[i] = show(i)(r)
		}
		if got[0] != got[1] {
			t.Errorf("%s:\n  etcd:   %s\n  engram: %s", c.what, got[0], got[1])
		}
	}
	// After ENABLE both report it in Status, the target as x.y.0. (etcd
	// lowers its cluster version later, by itself, so what it answers to
	// the next Downgrade depends on timing and is not compared.)
	for i := range 2 {
		st, err := maint[i].Status(ctx, &pb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if info := st.DowngradeInfo; info == nil || !info.Enabled || info.TargetVersion != at(i, 1)+".0" {
			t.Errorf("%s: Status downgrade info %+v, want enabled to %s.0", p.names[i], info, at(i, 1))
		}
		if _, err := maint[i].Downgrade(ctx, &pb.DowngradeRequest{Action: pb.DowngradeRequest_CANCEL}); err != nil {
			t.Errorf("%s: cancel: %v", p.names[i], err)
		}
	}
}

// TestEtcdctlDowngrade: etcdctl 3.6's downgrade commands against Engram.
func TestEtcdctlDowngrade(t *testing.T) {
	etcdtest.Require(t)
	ep := "--endpoints=" + servertest.Start(t, memkv.New(), servertest.Options{}).Endpoint
	cur := release.Current().Cluster()
	prev := fmt.Sprintf("0.%d", release.Current().Minor-1)
	for _, c := range []struct {
		args []string
		out  string // printed on success
		err  string // in the error otherwise
	}{
		{args: []string{"downgrade", "validate", prev}, out: "Downgrade validate success, cluster version " + cur},
		{args: []string{"downgrade", "validate", "3.5"}, err: "etcdserver: invalid downgrade target version"},
		{args: []string{"downgrade", "validate", "three"}, err: "etcdserver: wrong downgrade target version format"},
		{args: []string{"downgrade", "enable", prev}, out: "Downgrade enable success, cluster version " + cur},
		{args: []string{"downgrade", "cancel"}, out: "Downgrade cancel success, cluster version " + cur},
		{args: []string{"downgrade", "enable", prev}, out: "Downgrade enable success, cluster version " + cur},
		{args: []string{"downgrade", "validate", "0.8"}, err: "etcdserver: invalid downgrade target version"},
		{args: []string{"endpoint", "status", "-w", "json"}, out: `"downgradeInfo":{"enabled":true,"targetVersion":"` + prev + `.0"}`},
		{args: []string{"downgrade", "enable", prev}, err: "etcdserver: cluster has a downgrade job in progress"},
		{args: []string{"downgrade", "cancel"}, out: "Downgrade cancel success, cluster version " + cur},
		{args: []string{"downgrade", "validate", prev}, out: "Downgrade validate success, cluster version " + cur},
	} {
		out, err := etcdtest.Etcdctl(t, append([]string{ep}, c.args...)...)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("etcdctl %s: %q, %v; want an error with %q", strings.Join(c.args, " "), out, err, c.err)
		case c.err == "" && (err != nil || !strings.Contains(out, c.out)):
			t.Errorf("etcdctl %s: %q, %v; want %q", strings.Join(c.args, " "), out, err, c.out)
		}
	}
}
