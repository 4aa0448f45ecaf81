# Build, run and test Engram. `make run` and `make test` are all a fresh
# machine needs (after .ci/run or the README's setup installed etcdctl).

GO      ?= go
BIN     := bin/engram
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
# Extra flags for `make run`, e.g. make run ARGS='--storage.engine=memkv'.
ARGS    ?=


.PHONY: build run test soak bench bench-tools bench-quick bench-scale bench-churn bench-go bench-plugins lint clean plugins adaptors sdk-examples sdk-test etcd-tools bench-sql

# The WebAssembly test plugins (wasm/testplugins/: memkv, faulty), built with the
# Go SDK as WASI reactors into wasm/testplugins/bin/. They are fixtures: the
# host's tests, the Kubernetes suite's wasm backend, the benchmarks' wasm row
# and `engram plugin verify` examples use them.
WASM_PLUGINS ?= memkv faulty
plugins:
	@for p in $(WASM_PLUGINS); do \
		echo "building wasm/testplugins/bin/$$p.wasm"; \
		(cd wasm/testplugins && GOOS=wasip1 GOARCH=wasm $(GO) build -trimpath -buildmode=c-shared -o bin/$$p.wasm ./$$p) || exit 1; \
	done

# The storage adaptors Engram ships (wasm/adaptors/: postgres, mysql), built with
# the Go SDK into bin/NAME.wasm beside bin/engram: the files an operator
# deploys with storage.wasm.file. The first build compiles the database
# drivers for wasm (about a minute).
ADAPTORS ?= postgres mysql
adaptors:
	@for p in $(ADAPTORS); do \
		echo "building bin/$$p.wasm"; \
		(cd wasm/adaptors && GOOS=wasip1 GOARCH=wasm $(GO) build -trimpath -buildmode=c-shared -o ../../bin/$$p.wasm ./$$p) || exit 1; \
	done

# The C and Rust SDKs' example adaptors (wasm/sdk/c: an ordered in-memory store
# in C; wasm/sdk/rust: one on std's BTreeMap), built with Debian's clang for
# wasm32-wasi and Debian's rustc (/usr/bin/rustc: a rustup toolchain earlier
# on PATH may lack the wasm32 target) into bin/examples/. Not part of build:
# `make run` must work on a machine without those toolchains. Where a
# toolchain is missing the language is skipped with a note, except in CI
# (CI set), where that is an error: .ci/run installs them.
RUSTC ?= /usr/bin/rustc
C_WASM_TOOLS    = command -v clang >/dev/null && command -v wasm-ld >/dev/null && test -d /usr/include/wasm32-wasi && \
	ls /usr/lib/llvm-*/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a >/dev/null 2>&1
RUST_WASM_TOOLS = test -x $(RUSTC) && test -d "$$($(RUSTC) --print sysroot)/lib/rustlib/wasm32-wasi"
# $(call with_tools,CHECK,WHAT,PACKAGES,COMMANDS)
with_tools = if $(1); then $(4); \
	elif [ -n "$$CI" ]; then echo "$(2): missing toolchain (apt-get install $(3); .ci/run does)"; exit 1; \
	else echo "skipping $(2): missing toolchain (apt-get install $(3))"; fi
C_PACKAGES    = clang lld wasi-libc libclang-rt-dev-wasm32
RUST_PACKAGES = rustc libstd-rust-dev-wasm32
sdk-examples:
	@$(call with_tools,$(C_WASM_TOOLS),the C SDK example,$(C_PACKAGES),$(MAKE) -C wasm/sdk/c OUT=$(CURDIR)/bin/examples example)
	@$(call with_tools,$(RUST_WASM_TOOLS),the Rust SDK example,$(RUST_PACKAGES),$(MAKE) -C wasm/sdk/rust RUSTC=$(RUSTC) OUT=$(CURDIR)/bin/examples example)

# The SDKs' own tests (golden vectors, dispatch) and the conformance suite
# run by `engram plugin verify` on their examples.
sdk-test: build sdk-examples
	@$(call with_tools,$(C_WASM_TOOLS),the C SDK tests,$(C_PACKAGES),\
		$(MAKE) -C wasm/sdk/c OUT=$(CURDIR)/bin/examples test && ./$(BIN) plugin verify bin/examples/memkv-c.wasm)
	@$(call with_tools,$(RUST_WASM_TOOLS),the Rust SDK tests,$(RUST_PACKAGES),\
		$(MAKE) -C wasm/sdk/rust RUSTC=$(RUSTC) OUT=$(CURDIR)/bin/examples test && ./$(BIN) plugin verify bin/examples/btree-rust.wasm)

# Per-call cost of each in-memory plugin (Go, C, Rust) through the host,
# beside the native memkv: `engram plugin bench`. The database adaptors need
# a database; the README shows how to bench them against yours.
bench-plugins: build sdk-examples
	./$(BIN) plugin bench wasm/testplugins/bin/memkv.wasm
	./$(BIN) plugin bench bin/examples/memkv-c.wasm
	./$(BIN) plugin bench bin/examples/btree-rust.wasm

build: plugins adaptors
	$(GO) build -trimpath -ldflags '-X main.version=$(VERSION)' -o $(BIN) ./cmd/engram

run: build
	./$(BIN) serve --listen-client-urls=http://127.0.0.1:2379 --data-dir=./data $(ARGS)

# Real etcd 3.6.16 tools, built from the Go module proxy by the wrapper
# module bench/etcd (its main.go wraps the server; etcdctl and etcdutl are
# `tool` directives in its go.mod, built unchanged): bin/etcd, bin/etcdctl36
# and bin/etcdutl. internal/etcdtest starts them to compare Engram with etcd
# and to make and restore real snapshots. etcdctl is renamed etcdctl36 so it
# cannot shadow Debian's etcdctl 3.4, which the end-to-end tests take from
# PATH. The binaries are rebuilt only when bench/etcd's go.mod, go.sum or
# main.go is newer. A clean build (empty build cache, modules already
# downloaded) took 2m10s on 2 cores; a first build also downloads etcd's
# modules. They go to a scratch directory first and are then moved in, so
# a bin/etcd symlink left by bench-tools' fallback is replaced, never
# written through.
# bin/etcd37 is etcd 3.7.0's server from the wrapper module bench/etcd37,
# for the tests of etcd 3.7's API (KV.RangeStream); it is built to a
# temporary name and renamed so an interrupted build leaves no half file.
ETCD_TOOLS := bin/etcd bin/etcdctl36 bin/etcdutl
etcd-tools: $(ETCD_TOOLS) bin/etcd37
bin/etcd37: bench/etcd37/go.mod bench/etcd37/go.sum bench/etcd37/main.go
	mkdir -p bin
	cd bench/etcd37 && $(GO) build -trimpath -o ../../bin/.etcd37.tmp .
	mv -f bin/.etcd37.tmp bin/etcd37
$(ETCD_TOOLS) &: bench/etcd/go.mod bench/etcd/go.sum bench/etcd/main.go
	rm -rf bin/.etcd-tools && mkdir -p bin/.etcd-tools
	cd bench/etcd && $(GO) build -trimpath -o ../../bin/.etcd-tools/ . go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/etcdutl/v3
	mv -f bin/.etcd-tools/etcd bin/etcd
	mv -f bin/.etcd-tools/etcdctl bin/etcdctl36
	mv -f bin/.etcd-tools/etcdutl bin/etcdutl
	rmdir bin/.etcd-tools
	touch $(ETCD_TOOLS)

# make test: the checks that need no server (vet, the ABI's golden vectors,
# the SDKs), then every suite side by side. Most suites mostly wait (paced
# clients, leases, fsyncs, databases, the Kubernetes suite's own timers):
# one after the other they took 12-13 of make test's minutes on 2 cores
# with the processors 40-70% idle, so they run as separate make targets,
# four at a time (SUITE_JOBS), the longest first, each one's output printed
# when it ends. The suites are compiled once before that (test-compile), so
# four runs do not build the same packages at once.
#
# The suites (each a target of its own: `make suite-lin` runs one):
# - suite-race: every root-module package under the race detector except
#   the end-to-end, differential and linearizability suites, whose work
#   happens in separately built servers or is paced against the clock. The
#   slowest packages are named first: go test starts packages in the order
#   given, three at a time (-p 3), and core/server's tests run four at a
#   time (-parallel 4; they wait on elections, etcd and fsyncs).
# - suite-adaptors: the shipped adaptors' tests, beside them in
#   wasm/adaptors (a module of its own): postgres.wasm on a throwaway
#   PostgreSQL, mysql.wasm on a throwaway MariaDB and on a three-node Galera
#   cluster, through the host. Without the race detector: the adaptors'
#   code runs as wasm, which it does not instrument, and suite-race runs the
#   host's own tests under it; instrumented, their 20 MiB commits and three
#   database servers made it the run's heaviest suite. One package at a
#   time (-p 1), as when they were the host's, and after the longest
#   suites have started.
# - suite-lin: tests/linearizability records concurrent clients' operations
#   and a watcher's events and checks them with porcupine against etcd's KV
#   semantics: one engram process on badger killed with SIGKILL, three over
#   PostgreSQL with the leader killed, three each on its own node of a
#   three-node MariaDB Galera cluster (the Engram leader, the database under
#   it, a paused database node and the quorum taken away), three in-process
#   nodes over a shared memkv with kills, store partitions and uncertain
#   commits, the same over client-go's mock TiKV while its regions split,
#   merge and change leaders, and three over that mock served over gRPC by
#   tikvserve with the leader killed, the whole fake restarted and a store
#   stopped; 20 s of load each. PostgreSQL, MariaDB and Galera runs are
#   skipped without them unless CI is set.
# - suite-upgrade: the rolling upgrade, from the same package: three
#   processes of the previous release (the newest v* tag before HEAD, built
#   from a git archive of it, 4-8 s with the build cache warm) over
#   PostgreSQL replaced one at a time by this build, then one rolled back
#   after a downgrade is enabled (about 30 s with the build). A clone
#   without tags builds the commit core/version's release table names; one
#   without that history (shallow) fails in CI and is skipped elsewhere.
# - suite-diff, suite-e2e: the differential test against etcd 3.6 and the
#   end-to-end tests of the built binary. These and suite-lin build or run
#   the real binary, which go test's cache cannot see: hence -count=1.
# - k8s-suite: the Kubernetes module's own tests (tests/k8s is a module of
#   its own: it pulls in Kubernetes). k8s-BACKEND: the Kubernetes storage
#   suite's etcd3 package again with Engram on BACKEND: badger (the default
#   engine, on disk), pebble, memkv.wasm, postgres.wasm and mysql.wasm over
#   a throwaway PostgreSQL and MariaDB, mysql.wasm over a three-node Galera
#   cluster, the TiKV adaptor over client-go's mock cluster, and badger
#   stores migrated from a real etcd by core/migrate.
# core/migrate's tests also migrate from kine (bin/kine, k3s's etcd shim) on
# a throwaway PostgreSQL (internal/kinetest; skipped without them unless CI
# is set).
# warmwasm compiles the database adaptors and the test plugins into the
# tests' shared wasm cache first, uninstrumented: under the race detector
# wazero's compiler takes about 80 s more per adaptor, and the compiled code
# is the same (its package doc says why it is a test).
# wasm/abi/, wasm/sdk/, internal/btree/, wasm/testplugins/ and
# wasm/adaptors/ are modules of their own (plugins link only them; the
# adaptors' tests, never built for wasip1, also link the main module); the
# SDK and the B-tree, which the memkv test plugin links, are also vetted for
# wasip1, the target plugins build for. The C and Rust SDKs decode and re-encode wasm/abi/testdata's golden
# vectors in their own tests, and their example adaptors must pass the same
# conformance suite as every engine (`engram plugin verify`).
SUITE_JOBS   ?= 4
RACE_FIRST    = ./core/server ./wasm/host ./engines/tikv ./core/migrate ./core/backup ./internal/mysqltest
RACE_PKGS     = $(RACE_FIRST) $(shell $(GO) list ./... | grep -v -e '/tests/e2e' -e '/tests/linearizability' -e '/tests/etcddiff' \
	$(foreach p,$(RACE_FIRST),-e 'engram/$(p:./%=%)$$'))
K8S_BACKENDS  = wasm-galera migrated tikv badger pebble wasm-memkv wasm-postgres wasm-mysql
SUITES        = suite-race suite-lin k8s-suite suite-upgrade suite-adaptors $(addprefix k8s-,$(K8S_BACKENDS)) suite-diff suite-e2e
.PHONY: test-compile $(SUITES)

test: build etcd-tools bin/kine
	$(GO) vet ./...
	cd wasm/abi && $(GO) vet ./... && $(GO) test ./...
	cd internal/btree && $(GO) vet ./... && GOOS=wasip1 GOARCH=wasm $(GO) vet ./... && $(GO) test -race ./...
	cd wasm/sdk && $(GO) vet ./... && GOOS=wasip1 GOARCH=wasm $(GO) vet ./... && $(GO) test ./...
	$(MAKE) --no-print-directory sdk-test
	cd wasm/testplugins && GOOS=wasip1 GOARCH=wasm $(GO) vet ./... && $(GO) test ./...
	cd wasm/adaptors && $(GO) vet ./... && GOOS=wasip1 GOARCH=wasm $(GO) vet ./...
	ENGRAM_WARM_WASM="$(CURDIR)/bin/postgres.wasm $(CURDIR)/bin/mysql.wasm $(CURDIR)/wasm/testplugins/bin/memkv.wasm $(CURDIR)/wasm/testplugins/bin/faulty.wasm" $(GO) test -count=1 -v -run '^TestWarm$$' ./internal/proctest/warmwasm/
	$(MAKE) --no-print-directory test-compile
	$(MAKE) --no-print-directory -j$(SUITE_JOBS) --output-sync=target $(SUITES)

# Compiles the suites that share packages (the Kubernetes runs share all
# of theirs) without running a test, so that side by side they do not
# compile the same code at once. suite-race's instrumented build is its own.
test-compile:
	$(GO) test -run '^$$' ./tests/... >/dev/null
	cd tests/k8s && $(GO) test -run '^$$' ./... >/dev/null
	cd wasm/adaptors && $(GO) test -run '^$$' ./... >/dev/null

suite-race:
	$(GO) test -race -p 3 -parallel 4 $(RACE_PKGS)
suite-adaptors:
	cd wasm/adaptors && $(GO) test -count=1 -p 1 ./...
UPGRADE_TEST  = ^TestClusterPostgresRollingUpgrade$$
suite-lin:
	$(GO) test -count=1 -skip '$(UPGRADE_TEST)' ./tests/linearizability/...
suite-upgrade:
	$(GO) test -count=1 -run '$(UPGRADE_TEST)' ./tests/linearizability/...
suite-diff:
	$(GO) test -count=1 ./tests/etcddiff/...
suite-e2e:
	$(GO) test -count=1 ./tests/e2e/...
k8s-suite:
	cd tests/k8s && $(GO) test ./...
k8s-wasm-memkv: K8S_WASM = $(CURDIR)/wasm/testplugins/bin/memkv.wasm
k8s-wasm-postgres: K8S_WASM = $(CURDIR)/bin/postgres.wasm
k8s-wasm-mysql k8s-wasm-galera: K8S_WASM = $(CURDIR)/bin/mysql.wasm
$(addprefix k8s-,$(K8S_BACKENDS)):
	cd tests/k8s && ENGRAM_K8S_BACKEND=$(@:k8s-%=%) $(if $(K8S_WASM),ENGRAM_K8S_WASM=$(K8S_WASM)) $(GO) test -count=1 ./etcd3/...

# The migration's follow phase is measured at 3,000 writes/s on a real
# etcd for 20 s (core/migrate TestFollowRate; ENGRAM_MIGRATE_RATE and
# ENGRAM_MIGRATE_SECONDS change it): it logs the lag, DESIGN.md keeps it.
# Longer linearizability runs than make test's: each run's load lasts
# SOAK_DURATION (the requirement is a minute of leader kills over
# PostgreSQL) and every run is repeated SOAK_COUNT times, the TiKV mock
# variant included. A minute's history is 45,000-60,000 operations: porcupine
# checks it in 2-6 s and under 2 GB. A failed run prints its seed
# (ENGRAM_LIN_SEED=...) and leaves its history and porcupine's visualization
# under $TMPDIR (or ENGRAM_LIN_ARTIFACTS).
SOAK_DURATION ?= 60s
SOAK_COUNT    ?= 3
soak: plugins adaptors etcd-tools
	ENGRAM_LIN_SOAK=1 ENGRAM_LIN_DURATION=$(SOAK_DURATION) $(GO) test -count=$(SOAK_COUNT) -timeout=0 -v \
		-run '^Test(SingleNode|Cluster)' ./tests/linearizability/
	ENGRAM_MIGRATE_SOAK=1 $(GO) test -count=1 -timeout=0 -v -run '^TestFollowRate$$' ./core/migrate/

# The differential test's long run (tests/etcddiff): DIFF_SEEDS
# runs of DIFF_OPS generated operations each, every one with a seed of its
# own, against etcd 3.6 and Engram on memkv, badger and memkv.wasm (make
# test runs one of 20,000). A failure prints its seed; ENGRAM_DIFF_SEED=N
# reproduces it. Every run is made, and the target fails if one did.
DIFF_SEEDS ?= 5
DIFF_OPS   ?= 200000
.PHONY: diff-long
diff-long: build etcd-tools
	@status=0; for i in $$(seq $(DIFF_SEEDS)); do \
		ENGRAM_DIFF_OPS=$(DIFF_OPS) $(GO) test -count=1 -timeout=0 -v -run '^TestDiff$$' ./tests/etcddiff/ || status=1; \
	done; exit $$status

# Load benchmarks (BENCHMARKS.md, bench/README.md). bench-tools builds the
# ceiling server, a real etcd 3.6 (bench/etcd pins it; if that build fails,
# Debian's etcd-server 3.4 is used when installed, and BENCHMARKS.md shows
# which etcd ran) and the harness, a module of its own so its chart library
# stays out of the server's module graph.
# BENCH_RSS_OBJECTS: objects loaded before measuring server memory (the
# benchmarks are specified at 1M). BENCH_ARGS: more harness flags, e.g.
# BENCH_ARGS='--stores=etcd,engram-badger --repeats=5'.
BENCH_RSS_OBJECTS ?= 1000000
BENCH_ARGS        ?=

bench-tools: build
	$(GO) build -trimpath -o bin/engram-ceiling ./bench/cmd/ceiling
	@if ! $(MAKE) --no-print-directory etcd-tools; then \
		echo "bench: building etcd from bench/etcd failed; falling back to Debian's etcd-server (apt-get install etcd-server; 3.4, older than the 3.6 the benchmarks compare with)"; \
		command -v etcd >/dev/null || { echo "bench: no etcd on PATH either"; exit 1; }; \
		ln -sf "$$(command -v etcd)" bin/etcd; \
	fi
	cd bench/harness && $(GO) build -trimpath -o ../../bin/engram-benchrun .
	@$(MAKE) --no-print-directory bin/kine || echo "bench: building kine from bench/kine failed; the kine-* stores are skipped"

# kine (k3s's etcd shim) for the SQL section of the benchmarks, built from the Go
# module proxy by the wrapper module bench/kine, which calls kine's own entry
# point; to a temporary name first, so an interrupted build leaves no half
# file. kine links SQLite through cgo: the first build takes a few minutes.
bin/kine: bench/kine/go.mod bench/kine/go.sum bench/kine/main.go
	mkdir -p bin
	cd bench/kine && $(GO) build -trimpath -o ../../bin/.kine.tmp .
	mv -f bin/.kine.tmp bin/kine

# Engram on PostgreSQL and MariaDB (postgres.wasm, mysql.wasm) beside kine on
# the same database and Engram on badger: the harness starts a
# throwaway PostgreSQL 15 and MariaDB on 127.0.0.1 with durability on, a
# fresh database per store run. Where either is not installed its stores are
# skipped with a note (an error under CI). The report goes to bin/bench-sql/;
# make bench includes the same stores. About 10 minutes on 2 cores.
SQL_STORES ?= engram-badger,engram-postgres,kine-postgres,engram-mysql,kine-mysql
bench-sql: bench-tools
	./bin/engram-benchrun --mode='make bench-sql' --stores=$(SQL_STORES) --repeats=3 --duration=5s \
		--rss-objects=0 --profile-dir= \
		--out=bin/bench-sql/BENCHMARKS.md --chart=bin/bench-sql/chart.png \
		--results=bin/bench-sql/results.json $(BENCH_ARGS)

# The full run: every store (the SQL ones of bench-sql too), 3 repeats of 5 s per workload with a server
# CPU profile of each, memory after BENCH_RSS_OBJECTS objects with a
# snapshot and restore of them, memory and disk after a small cluster's
# objects (etcd, badger, pebble), the Go benchmarks, the cost curves
# (bench-scale's part) and the disk under churn (bench-churn's part); writes
# BENCHMARKS.md and bench/results/. About 80 minutes on 2 cores: 27 for the
# workloads, memory and small cluster, 25 for the cost curves, 25 for the
# churn.
bench: bench-tools
	./bin/engram-benchrun --mode='make bench' --repeats=3 --duration=5s \
		--rss-objects=$(BENCH_RSS_OBJECTS) --go-bench --small-cluster \
		--scale=$(BENCH_SCALE) --churn=$(BENCH_CHURN) $(BENCH_ARGS)

# A smoke run (about 2 minutes): one repeat of 2 s, a small memory load; its
# report goes to bin/bench-quick/, leaving BENCHMARKS.md alone.
bench-quick: bench-tools
	./bin/engram-benchrun --mode='make bench-quick' --repeats=1 --duration=2s \
		--delete-keys=30000 --rss-objects=20000 --profile-dir= \
		--out=bin/bench-quick/BENCHMARKS.md --chart=bin/bench-quick/chart.png \
		--results=bin/bench-quick/results.json $(BENCH_ARGS)

# Cost curves only: etcd and Engram on badger, each one server
# grown to every BENCH_SCALE object count and measured there (get, create,
# full list, watch p99, RSS and disk per object, kill -9 recovery); report
# in bin/bench-scale/. About 25 minutes on 2 cores at the default points.
BENCH_SCALE ?= 10000,100000,1000000,5000000
bench-scale: bench-tools
	./bin/engram-benchrun --mode='make bench-scale' --repeats=0 --rss-objects=0 --profile-dir= \
		--scale=$(BENCH_SCALE) \
		--out=bin/bench-scale/BENCHMARKS.md --chart=bin/bench-scale/chart.png \
		--results=bin/bench-scale/results.json $(BENCH_ARGS)

# Disk under churn only: etcd and Engram on badger, each a fresh
# server, BENCH_CHURN (10m) of updates on 10,000 keys with kube-apiserver's
# compaction every 5 minutes, then each store's reclamation; disk use, and
# throughput over time. The report and chart go to bin/bench-churn/.
BENCH_CHURN ?= 10m
bench-churn: bench-tools
	./bin/engram-benchrun --mode='make bench-churn' --repeats=0 --rss-objects=0 --profile-dir= \
		--churn=$(BENCH_CHURN) \
		--out=bin/bench-churn/BENCHMARKS.md --chart=bin/bench-churn/chart.png \
		--results=bin/bench-churn/results.json --churn-chart=bin/bench-churn/churn.png \
		--churn-results=bin/bench-churn/churn.json $(BENCH_ARGS)

# Go micro-benchmarks of the root module's packages (not tests/, whose
# TestMain builds and starts servers). BENCH_GO_FLAGS adds go test flags,
# e.g. BENCH_GO_FLAGS=-benchtime=300ms (what make bench uses, to fit its
# time budget).
BENCH_GO_FLAGS ?=
bench-go:
	$(GO) test -run='^$$' -bench=. -benchmem $(BENCH_GO_FLAGS) $$($(GO) list ./... | grep -v '/tests/')

lint:
	@unformatted="$$(gofmt -l .)"; if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd tests/k8s && $(GO) vet ./...

# Removes build output only; ./data (make run's store) is left alone.
clean:
	rm -rf bin wasm/testplugins/bin
	$(MAKE) -C wasm/sdk/c clean
	$(MAKE) -C wasm/sdk/rust RUSTC=$(RUSTC) clean
