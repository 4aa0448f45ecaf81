package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	etcdversion "go.etcd.io/etcd/api/v3/version"

	release "github.com/engramkv/engram/core/version"
)

// version is stamped at build time (make build passes
// -ldflags "-X main.version=..."); it is a constant for the life of the
// process, not mutable state.
var version = ""

// buildVersion is this build's semantic version, with the stamp of an
// untagged build (core/version.Build).
func buildVersion() string { return release.Build(stamp()) }

// stamp is the -X main.version stamp, else the VCS revision Go recorded
// in the binary, else empty.
func stamp() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return s.Value[:12]
		}
	}
	return ""
}

func versionMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "engram version: unexpected argument %q\n", args[0])
		return 2
	}
	// The etcd version is what Status reports to clients; kube-apiserver
	// gates features on it.
	// The storage formats say which data directories and shared stores
	// this binary can serve (DESIGN.md, "Versions and compatibility").
	fmt.Fprintf(stdout, "engram %s\nstorage format %d (reads %d and newer)\netcd API %s\n%s %s/%s\n",
		buildVersion(), release.StorageFormat, release.OldestStorageFormat,
		etcdversion.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return 0
}
