package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/coreos/go-semver/semver"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/internal/etcdapi"
	"github.com/engramkv/engram/core/kv"
	release "github.com/engramkv/engram/core/version"
)

// Downgrade answers etcd's Downgrade RPC for Engram's versions: the version
// in the request is an Engram version (major.minor, or a full semantic
// version whose patch is ignored, as etcd does), the cluster version in the
// answer is Engram's. The rule allows exactly one minor down, to a release
// this build knows (core/version.Releases).
//
// ENABLE writes downgradeRecord, which every member reads, so the cluster
// version falls to the target right after the answer on all of them and
// after restarts;
// features gated on the newer version are refused from then on. CANCEL
// deletes it. The record stays after the members are rolled back (0.9.0
// members do not read it) and after they are upgraded again, until an
// operator cancels: only then does the cluster version rise. etcd ends a
// downgrade by itself once every member runs the target; Engram cannot tell
// a rolled-back member from a stopped one (clusterversion.go), so it does
// not guess.
const downgradeRecord = "downgrade"

type downgradeState struct {
	Target string `json:"target"`
}

// errUnknownMethod is etcd's answer to an action it does not know; etcd has
// no gRPC error for it, so clients get its text with codes.Unknown.
var errUnknownMethod = status.Error(codes.Unknown, "etcdserver: unknown method")

type downgrader struct{ s *Server }

var _ etcdapi.Downgrader = downgrader{}

func (d downgrader) Downgrade(ctx context.Context, r *pb.DowngradeRequest) (*pb.DowngradeResponse, error) {
	s := d.s
	switch r.Action {
	case pb.DowngradeRequest_VALIDATE, pb.DowngradeRequest_ENABLE:
		target, err := downgradeTargetVersion(r.Version)
		if err != nil {
			return nil, err
		}
		cv, err := s.clusterVersion(ctx)
		if err != nil {
			return nil, err
		}
		known, err := validateDowngrade(cv, target)
		if err != nil {
			return nil, err
		}
		if r.Action == pb.DowngradeRequest_VALIDATE {
			return &pb.DowngradeResponse{Version: cv.inForce.Cluster()}, nil
		}
		if err := downgradeBlockers(ctx, s.opts.Store, known, cv.newestFormat, storedFeatures()); err != nil {
			return nil, err
		}
		raw, _ := json.Marshal(downgradeState{Target: target.String()})
		if err := s.opts.Store.Commit(ctx, []kv.Op{kv.Put(coder.MetaKey(downgradeRecord), raw)}); err != nil {
			return nil, fmt.Errorf("enable downgrade to %s: %w", target.Cluster(), err)
		}
		s.log.Info("downgrade enabled", "target", target.Cluster(), "members", cv.members.Cluster())
		// As etcd 3.6, which lowers its cluster version only after it
		// answers: the answer is the version the cluster ran at.
		return &pb.DowngradeResponse{Version: cv.inForce.Cluster()}, nil
	case pb.DowngradeRequest_CANCEL:
		target, err := s.downgradeTarget(ctx)
		if err != nil {
			return nil, err
		}
		if target == nil {
			// etcd 3.6 logs ErrNoInflightDowngrade and answers success.
			s.log.Warn("failed to cancel downgrade", "err", rpctypes.ErrNoInflightDowngrade)
			return d.answer(ctx)
		}
		if err := s.opts.Store.Commit(ctx, []kv.Op{kv.Delete(coder.MetaKey(downgradeRecord))}); err != nil {
			return nil, fmt.Errorf("cancel downgrade: %w", err)
		}
		s.log.Info("downgrade cancelled", "target", target.Cluster())
		return d.answer(ctx)
	default:
		return nil, errUnknownMethod
	}
}

// answer reports the cluster version now in force.
func (d downgrader) answer(ctx context.Context) (*pb.DowngradeResponse, error) {
	cv, err := d.s.clusterVersion(ctx)
	if err != nil {
		return nil, err
	}
	return &pb.DowngradeResponse{Version: cv.inForce.Cluster()}, nil
}

// DowngradeInfo is Status's downgrade field, as etcd 3.6 fills it.
func (d downgrader) DowngradeInfo(ctx context.Context) *pb.DowngradeInfo {
	target, err := d.s.downgradeTarget(ctx)
	if err != nil || target == nil {
		return &pb.DowngradeInfo{Enabled: false}
	}
	return &pb.DowngradeInfo{Enabled: true, TargetVersion: target.String()}
}

// downgradeTargetVersion parses the request's version as etcd does (a
// semantic version, or major.minor) and keeps major.minor.
func downgradeTargetVersion(v string) (release.Version, error) {
	ver, err := semver.NewVersion(v)
	if err != nil {
		if ver, err = semver.NewVersion(v + ".0"); err != nil {
			return release.Version{}, rpctypes.ErrGRPCWrongDowngradeVersionFormat
		}
	}
	return release.Version{Major: int(ver.Major), Minor: int(ver.Minor)}, nil
}

// validateDowngrade is etcd's check: the target is one minor below the
// members' version and no downgrade is in progress; Engram also needs to
// know the target release's formats.
func validateDowngrade(cv clusterVersion, target release.Version) (release.Known, error) {
	known, ok := release.Previous(cv.members)
	if !ok || known.Version != target {
		return release.Known{}, rpctypes.ErrGRPCInvalidDowngradeTargetVersion
	}
	if cv.downgrade != nil {
		return release.Known{}, rpctypes.ErrGRPCDowngradeInProcess
	}
	return known, nil
}

// downgradeTarget reads the enabled downgrade's target, nil when none is.
func (s *Server) downgradeTarget(ctx context.Context) (*release.Version, error) {
	raw, err := s.getMeta(ctx, downgradeRecord)
	if err != nil || raw == nil {
		return nil, err
	}
	var st downgradeState
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, fmt.Errorf("downgrade record: %w", err)
	}
	v, err := release.Parse(st.Target)
	if err != nil {
		return nil, fmt.Errorf("downgrade record: %w", err)
	}
	v = v.MajorMinor()
	return &v, nil
}

// errNoDowngrade wraps every refusal of downgradeBlockers.
var errNoDowngrade = errors.New("engram: cannot downgrade")
