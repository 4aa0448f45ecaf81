// Package version owns what one Engram build says about itself: its
// semantic version (Release), the storage format it writes and the oldest
// it reads, and the table of earlier releases a cluster can be downgraded
// to. The compatibility rule these numbers serve is in DESIGN.md,
// "Versions and compatibility": version N serves data written by N-1 and
// runs in one cluster with N-1.
//
// It holds constants and pure functions only: which version a cluster runs
// at, and what may be switched on, is core/server's business (it reads the
// members' records in the store); the build stamp comes from the binary
// (cmd/engram's -X main.version).
package version

import (
	"fmt"
	"strconv"
	"strings"
)

// Release is the semantic version of this source tree. It changes in the
// commit that prepares a release, the one the release's tag (v + Release)
// points at.
const Release = "0.10.0"

// StorageFormat is the newest record format this build writes (core/internal/mvcc:
// version records); OldestStorageFormat is the oldest it still reads (the
// change log's and leases' records, and version records written before sub
// revisions were kept). mvcc's tests hold its constants to these.
const (
	StorageFormat       = 2
	OldestStorageFormat = 1
)

// Version is a semantic version; Engram compares versions by major and
// minor only (a cluster version is major.minor, as etcd's).
type Version struct {
	Major, Minor, Patch int
}

// Current is Release parsed.
func Current() Version {
	v, err := Parse(Release)
	if err != nil {
		panic(fmt.Sprintf("version: Release %q: %v", Release, err))
	}
	return v
}

// Parse reads "MAJOR.MINOR.PATCH" or "MAJOR.MINOR", with an optional
// leading "v"; a pre-release or build suffix ("-dev+abc") is ignored.
func Parse(s string) (Version, error) {
	t := strings.TrimPrefix(s, "v")
	if i := strings.IndexAny(t, "-+"); i >= 0 {
		t = t[:i]
	}
	parts := strings.Split(t, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return Version{}, fmt.Errorf("version %q: want MAJOR.MINOR[.PATCH]", s)
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 || p == "" || (len(p) > 1 && p[0] == '0') {
			return Version{}, fmt.Errorf("version %q: %q is not a number", s, p)
		}
		n[i] = v
	}
	return Version{Major: n[0], Minor: n[1], Patch: n[2]}, nil
}

// MajorMinor drops the patch level: the version as a cluster version.
func (v Version) MajorMinor() Version { return Version{Major: v.Major, Minor: v.Minor} }

// Less reports whether v is older than w by major and minor.
func (v Version) Less(w Version) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	return v.Minor < w.Minor
}

// String is "MAJOR.MINOR.PATCH".
func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Cluster is "MAJOR.MINOR", the form etcd uses for cluster versions.
func (v Version) Cluster() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// Build is the version a binary prints: Release when it was built from the
// release's tag (stamp "v"+Release, as `git describe` stamps it), else
// Release with "-dev" and the stamp ("0.10.0-dev+v0.9.0-3-gaf32cfd"), so an
// untagged build never passes for the release. An empty stamp (go build
// without make) gives "-dev" alone.
func Build(stamp string) string {
	switch stamp {
	case "v" + Release:
		return Release
	case "":
		return Release + "-dev"
	}
	return Release + "-dev+" + strings.TrimPrefix(stamp, "v")
}
