// Command etcd is a real etcd 3.7 server, built from the Go module proxy for
// the tests that compare Engram with etcd 3.7's API, KV.RangeStream first
// (make etcd-tools builds it as bin/etcd37; internal/etcdtest starts it).
// bench/etcd keeps building 3.6, the release the rest of the differential
// tests and the benchmarks compare with.
//
// Like bench/etcd it only pins the server version and calls etcd's own entry
// point unchanged: anything added here would make the reference etcd
// something else.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
