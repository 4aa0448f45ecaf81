# Build, run and test Engram. `make run` and `make test` are all a fresh
# machine needs (after .ci/run or the README's setup installed etcdctl).

GO      ?= go
BIN     := bin/engram
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
# Extra flags for `make run`, e.g. make run ARGS='--storage.engine=memkv'.
ARGS    ?=

# Root-module packages tested with the race detector: everything but the
# end-to-end suite, whose work happens in a separately built server process
# (instrumenting the test driver would only slow it down).
RACE_PKGS = $(shell $(GO) list ./... | grep -v '/tests/e2e')

.PHONY: build run test bench lint clean

build:
	$(GO) build -trimpath -ldflags '-X main.version=$(VERSION)' -o $(BIN) ./cmd/engram

run: build
	./$(BIN) serve --listen-client-urls=http://127.0.0.1:2379 --data-dir=./data $(ARGS)

# tests/e2e builds and runs the real binary; go test's cache cannot see that
# dependency, so -count=1 makes it run against the current sources every time.
# tests/k8s is a separate module (it pulls in Kubernetes), tested last.
test:
	$(GO) vet ./...
	$(GO) test -race $(RACE_PKGS)
	$(GO) test -count=1 ./tests/e2e/...
	cd tests/k8s && $(GO) test ./...

# PLACEHOLDER: runs whatever Go benchmarks exist. A dedicated load benchmark
# (engram bench) replaces this target later.
bench:
	$(GO) test -run='^$$' -bench=. ./...

lint:
	@unformatted="$$(gofmt -l .)"; if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd tests/k8s && $(GO) vet ./...

# Removes build output only; ./data (make run's store) is left alone.
clean:
	rm -rf bin
