package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/internal/coder"
	"github.com/engramkv/engram/core/internal/mvcc"
	"github.com/engramkv/engram/core/kv"
	release "github.com/engramkv/engram/core/version"
)

// The cluster version is the version every member understands: the lowest
// among the registered members, lowered further to the target of an
// enabled downgrade (downgrade.go). A change of format or protocol is
// switched on only at a cluster version that has it (requireClusterVersion);
// DESIGN.md, "Versions and compatibility", gives the rule.
//
// Each member publishes its version under memberVersionPrefix when it
// registers (and keeps it while it is down), and names its release in every
// Status answer (etcdapi.ReleaseHeader): a member that answers is taken at
// its word, the record speaks for one that does not. The key is a prefix
// of its own, not part of the member/ record: 0.9.0 members read
// member/<name> as exactly the comma-joined client URLs, and their scan of
// member/ stops at the first key outside it, so they never see these
// records. A member that neither answers nor has a record is a 0.9.0
// member. One that is down counts as the release it last published: a
// follower stopped for maintenance or lost in a failover must not hold
// back a promotion. Coming back as an older binary is a rollback, which
// starts with a downgrade (downgrade.go) whatever the records say.
const memberVersionPrefix = "memberversion/"

// memberVersion is a member's published record.
type memberVersion struct {
	Version string `json:"version"`
	// StorageFormat and OldestStorageFormat are the record formats it
	// writes and the oldest it reads (core/version).
	StorageFormat       int `json:"storageFormat"`
	OldestStorageFormat int `json:"oldestStorageFormat"`
}

func (s *Server) versionRecord() kv.Op {
	raw, _ := json.Marshal(memberVersion{Version: release.Release, StorageFormat: release.StorageFormat, OldestStorageFormat: release.OldestStorageFormat})
	return kv.Put(coder.MetaKey(memberVersionPrefix+s.opts.Name), raw)
}

// clusterVersion is what the gate and the Downgrade RPC decide on.
type clusterVersion struct {
	// inForce is the cluster version (major.minor): members, lowered to
	// downgrade's target while one is enabled.
	inForce release.Version
	// members is the lowest version among the members, and oldest a member
	// running it.
	members release.Version
	oldest  string
	// newestFormat is the newest storage format a member writes.
	newestFormat int
	// downgrade is the enabled downgrade's target, if any.
	downgrade *release.Version
}

// clusterVersion reads the members' records and the downgrade record.
func (s *Server) clusterVersion(ctx context.Context) (clusterVersion, error) {
	cv := clusterVersion{members: release.Current().MajorMinor(), oldest: s.opts.Name, newestFormat: release.StorageFormat}
	if s.opts.Cluster.Enabled {
		members, err := s.members(ctx)
		if err != nil {
			return cv, err
		}
		recorded := map[string]memberVersion{}
		records, err := s.scanMeta(ctx, memberVersionPrefix)
		if err != nil {
			return cv, fmt.Errorf("%w: read member versions: %w", mvcc.ErrUnavailable, err)
		}
		for _, r := range records {
			var mv memberVersion
			if err := json.Unmarshal(r.Value, &mv); err != nil {
				s.log.Warn("unreadable member version record; counting the member as the oldest version", "member", string(r.Key), "err", err)
				continue
			}
			recorded[string(r.Key)] = mv
		}
		first := true
		for _, m := range members {
			if m.Name == "" {
				continue // added, not started: it runs nothing yet
			}
			v := s.memberRelease(ctx, m, recorded)
			if mv, ok := recorded[m.Name]; ok {
				cv.newestFormat = max(cv.newestFormat, mv.StorageFormat)
			}
			if first || v.Less(cv.members) {
				cv.members, cv.oldest, first = v, m.Name, false
			}
		}
	}
	cv.inForce = cv.members
	target, err := s.downgradeTarget(ctx)
	if err != nil {
		return cv, err
	}
	if target != nil {
		cv.downgrade = target
		if target.Less(cv.inForce) {
			cv.inForce = *target
		}
	}
	return cv, nil
}

// memberRelease is the release (major.minor) member runs: its own answer
// when it answers its Status (a running member is what it says, whatever
// its record: a member killed and started again as an older binary leaves
// a stale one behind), else its record, else the oldest it could be.
func (s *Server) memberRelease(ctx context.Context, m *pb.Member, recorded map[string]memberVersion) release.Version {
	if m.Name == s.opts.Name {
		return release.Current().MajorMinor()
	}
	parse := func(r string) release.Version {
		if v, err := release.Parse(r); err == nil {
			return v.MajorMinor()
		}
		return release.Unrecorded()
	}
	if r, err := (membership{s}).probeRelease(ctx, m); err == nil {
		return parse(r)
	}
	if mv, ok := recorded[m.Name]; ok {
		return parse(mv.Version)
	}
	return release.Unrecorded()
}

// requireClusterVersion is the gate for a feature that changes a format or
// a protocol: it answers nil when the cluster version is need (major.minor)
// or newer, else FailedPrecondition naming what holds the cluster back, the
// member too old or the downgrade in progress. Call it where the feature
// is switched on (the request that first writes the new record), not on
// every use: a member that stops and comes back older is the operator's
// downgrade (downgrade.go), not something a request can prevent.
func (s *Server) requireClusterVersion(ctx context.Context, feature string, need release.Version) error {
	cv, err := s.clusterVersion(ctx)
	if err != nil {
		return fmt.Errorf("%s: read the cluster version: %w", feature, err)
	}
	if !cv.inForce.Less(need) {
		return nil
	}
	if cv.downgrade != nil && cv.downgrade.Less(need) && !cv.members.Less(need) {
		return status.Errorf(codes.FailedPrecondition, "engram: %s needs cluster version %s; a downgrade to %s is enabled (etcdctl downgrade cancel ends it)",
			feature, need.Cluster(), cv.downgrade.Cluster())
	}
	return status.Errorf(codes.FailedPrecondition, "engram: %s needs cluster version %s; member %q runs %s (or has not published its version: upgrade it, or remove it if it is gone)",
		feature, need.Cluster(), cv.oldest, cv.members.Cluster())
}

// getMeta returns a meta record, or nil when there is none.
func (s *Server) getMeta(ctx context.Context, name string) ([]byte, error) {
	raw, err := s.opts.Store.Get(ctx, coder.MetaKey(name))
	if errors.Is(err, kv.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", mvcc.ErrUnavailable, name, err)
	}
	return raw, nil
}
