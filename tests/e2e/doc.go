// Package e2e tests the real engram binary from the outside, the way an
// operator and kube-apiserver meet it: TestMain builds cmd/engram once, each
// test starts it as a subprocess on 127.0.0.1 with ports and a data directory
// chosen at run time, and talks to it with go.etcd.io/etcd/client/v3, with
// etcdctl and over HTTP. Expected behaviour is real etcd's (3.5/3.6).
//
// This package holds tests only: it must not be imported, and it must not
// reach into the server's internals (anything it needs must be observable
// through the binary's flags, sockets, signals and exit codes).
//
// E2E_ENGRAM_BINARY, when set, names a prebuilt binary to test instead of
// building one (for example a -race build or a release artefact).
package e2e
