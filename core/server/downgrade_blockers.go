package server

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/engramkv/engram/core/kv"
	release "github.com/engramkv/engram/core/version"
)

// A storedFeature is something a release keeps in the store that the
// release before it cannot read. Once it is there, a downgrade past since
// would hand the older members data they misread, so ENABLE refuses it
// until the feature's data is gone. The feature that adds such a record
// adds its entry to storedFeatures in the same commit.
type storedFeature struct {
	name  string
	since release.Version
	// present reports whether the store holds the feature's data.
	present func(ctx context.Context, st kv.Store) (bool, error)
}

// storedFeatures is this release's list. 0.10.0's member version and
// downgrade records sit under keys 0.9.0 never reads, and so do the member
// records of etcdctl's member commands (members.go); but two of those
// change what a 0.9.0 node would do, so they are listed: a learner, which
// a 0.9.0 node would let campaign, and a member added and not started,
// which a 0.9.0 node would not list, and whose node would then join under
// another ID. A member that was added and has started (its ID not its
// name's hash) is not: a 0.9.0 node lists it under its name's hash, which
// the README's rollback section says.
func storedFeatures() []storedFeature {
	return []storedFeature{
		{name: "a learner (promote or remove it)", since: membershipRelease, present: func(ctx context.Context, st kv.Store) (bool, error) {
			attrs, err := scanMeta(ctx, st, attrPrefix)
			if err != nil {
				return false, err
			}
			for _, a := range attrs {
				if m, err := decodeAttrs(a.Value); err == nil && m.Learner {
					return true, nil
				}
			}
			return false, nil
		}},
		{name: "a member added and not started (start or remove it)", since: membershipRelease, present: func(ctx context.Context, st kv.Store) (bool, error) {
			pending, err := scanMeta(ctx, st, pendingPrefix)
			return len(pending) > 0, err
		}},
	}
}

// downgradeBlockers refuses a downgrade to target when the members write a
// storage format newer than target reads, or when a stored feature newer
// than target is present.
func downgradeBlockers(ctx context.Context, st kv.Store, target release.Known, newestFormat int, features []storedFeature) error {
	if newestFormat > target.Writes {
		return status.Errorf(codes.FailedPrecondition, "%v to %s: members write storage format %d, which %s does not read (it reads %d to %d)",
			errNoDowngrade, target.Version.Cluster(), newestFormat, target.Version.Cluster(), target.Reads, target.Writes)
	}
	for _, f := range features {
		if !target.Version.Less(f.since) {
			continue
		}
		ok, err := f.present(ctx, st)
		if err != nil {
			return fmt.Errorf("downgrade to %s: look for %s: %w", target.Version.Cluster(), f.name, err)
		}
		if ok {
			return status.Errorf(codes.FailedPrecondition, "%v to %s: the store holds %s, which needs %s or newer; remove it first",
				errNoDowngrade, target.Version.Cluster(), f.name, f.since.Cluster())
		}
	}
	return nil
}
