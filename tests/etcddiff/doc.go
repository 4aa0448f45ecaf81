// Package etcddiff is a seeded differential test of Engram against a real
// etcd 3.6: a generator of random KV, Txn, Lease and Watch
// requests, malformed ones included, over a small key space where
// operations collide; a runner that sends each request over raw gRPC to one
// oracle etcd and, at the same time, to every target (a second etcd, and
// Engram on memkv, on badger and on the memkv.wasm plugin); and a
// comparison of every answer with only what must differ normalised.
//
// It owns tests only; the package holds no code outside its _test.go files
// but this comment. It must not fix or work around Engram's differences
// (they are fixed in the core, and the test is expected to pass once they
// are), must not normalise anything etcd itself does not leave free (a
// second etcd gives zero differences and proves it), must bind only to
// 127.0.0.1 and must stop every server it starts.
//
// Reproduce a failure with the seed it prints:
//
//	ENGRAM_DIFF_SEED=<seed> go test -count=1 ./tests/etcddiff/
//
// ENGRAM_DIFF_OPS sets the number of operations (default 20000),
// ENGRAM_DIFF_TARGETS the targets (default etcd,memkv,badger,wasm) and
// ENGRAM_DIFF_SKIP a comma-separated list of operation classes the generator
// leaves out, for investigating one difference at a time (see classes in
// gen_test.go); `make test` skips none. ENGRAM_DIFF_TRACE=1 logs every
// operation with etcd's answer; ENGRAM_DIFF_FLUSH=N reads the watch streams
// only every N operations (default 1).
package etcddiff
