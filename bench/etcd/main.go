// Command etcd is a real etcd server, built from the Go module proxy for the
// side-by-side benchmarks (make bench) and for the tests that compare Engram
// with etcd (make etcd-tools; internal/etcdtest). This module's go.mod also
// lists etcdctl and etcdutl of the same release as tools, built unchanged
// next to it (bin/etcdctl36, bin/etcdutl), so all three share one dependency
// graph.
//
// `go install go.etcd.io/etcd/server/v3` is refused because etcd's go.mod has
// replace directives, so this wrapper module pins the server version and
// calls etcd's own entry point unchanged. It must stay a plain wrapper: any
// flag or behaviour added here would make the reference etcd something else.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
