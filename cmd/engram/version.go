package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	etcdversion "go.etcd.io/etcd/api/v3/version"
)

// version is stamped at build time (make build passes
// -ldflags "-X main.version=..."); it is a constant for the life of the
// process, not mutable state.
var version = ""

// buildVersion returns the stamped version, else the module version and VCS
// revision Go recorded in the binary, else "devel".
func buildVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	v := bi.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}

func versionMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "engram version: unexpected argument %q\n", args[0])
		return 2
	}
	// The etcd version is what Status reports to clients; kube-apiserver
	// gates features on it.
	fmt.Fprintf(stdout, "engram %s\netcd API %s\n%s %s/%s\n",
		buildVersion(), etcdversion.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return 0
}
