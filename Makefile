# syncloop — developer entry points. `make help` lists them.

GO       ?= go
BIN      := bin/syncloop
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
# Flags for `go test`; CI and `make test` run everything, including the
# integration tests against the local control plane. The integration tests
# mostly wait on the API server: four run at once on two cores.
TESTFLAGS ?= -race -count=1 -timeout=30m -parallel=4
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME ?= 3s

IMAGE    ?= ghcr.io/syncloop/syncloop:$(VERSION)
PLATFORMS ?= linux/amd64,linux/arm64

.PHONY: help check fuzz-smoke test-robustness build build-static functions image image-push krew test test-short testenv openapi-snapshot demo cluster bench bench-full soak robustness lint clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

build: ## build bin/syncloop
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/syncloop

functions: ## build the examples' function steps for WebAssembly: examples/<name>/<name>.wasm from examples/<name>/function
	$(GO) run ./hack/functions

build-static: ## build bin/syncloop statically (CGO_ENABLED=0), as the image does
	CGO_ENABLED=0 $(GO) build -trimpath -tags timetzdata -ldflags "-s -w $(LDFLAGS)" -o $(BIN) ./cmd/syncloop

image: ## build the image as docker-load-able archives bin/syncloop-image-<arch>.tar (no Docker engine needed)
	$(GO) run ./hack/image -version $(VERSION) -repo $(firstword $(subst :, ,$(IMAGE))) -platforms $(PLATFORMS) -out bin

image-push: ## push the multi-platform image to IMAGE=registry/repo:tag (credentials as docker login keeps them)
	$(GO) run ./hack/image -version $(VERSION) -platforms $(PLATFORMS) -push $(IMAGE)

krew: ## the kubectl plugin for krew, VERSION=v0.9.0: bin/krew/syncloop-<os>-<arch>.tar.gz and the manifest bin/krew/syncloop.yaml
	$(GO) run ./hack/krew-release -version $(VERSION) -out bin/krew

testenv: ## build the local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok), kubectl, krew and helm into the cache, once
	@bash hack/testenv.sh

openapi-snapshot: testenv ## refresh the compiled-in schemas of the built-in kinds from the local kube-apiserver
	$(GO) run ./hack/openapi-snapshot -o rules/schema/builtin.json.gz

test: testenv functions ## run every test, integration tests against the local control plane included
	$(GO) test $(TESTFLAGS) ./...

test-short: ## run the unit tests only (no control plane)
	$(GO) test -short -count=1 ./...

check: lint ## gofmt, go vet, staticcheck and the unit tests, in about a minute: run first by CI
	$(GO) vet -tags robustness ./engine/
	$(GO) run $(STATICCHECK) ./...
	$(GO) test -short -count=1 ./...

fuzz-smoke: ## run each fuzz target for FUZZTIME (default 3s); FUZZFLAGS are passed to go test
	@for f in $$(grep -rl --include='*_test.go' '^func Fuzz' .); do \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "fuzz $$t ($$(dirname $$f))"; \
			$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS) ./$$(dirname $$f) || exit 1; \
		done; \
	done

test-robustness: testenv ## the leak and outage tests and the short fault campaign, each in a process of its own, side by side (CI runs them once, without the race detector)
	hack/test-robustness.sh $(GO)

demo: testenv build functions ## syncloop reconciling the examples on a local control plane it starts (and stops)
	$(GO) run ./hack/demo --syncloop $(BIN) --examples examples

cluster: testenv ## start the local control plane in the foreground, print its kubeconfig; Ctrl-C stops it
	$(GO) run ./hack/localcluster

bench: testenv build ## benchmark at the defaults against the API server's limit: 1,000 triggers in process, one lookup source read by 10,000, a rule change over 10,000 triggers, 10 rules as 10 identities, 1,000 chains of three, 1,000 triggers with a child in each of 5 workload clusters, 10,000 children from a wasm function, 5,000 Tenants, 2,000 under pushback, 10,000 CEL-heavy triggers on 1 and 3 sharded replicas and the memory of 100,000 Tenants with bin/syncloop; appends to bench/RESULTS.md
	$(GO) run ./bench -n 1000 -engine-rounds 3 -fanout 10000 -rollout 10000 -identities 10 -chain 1000 -function 10000 -fleet 1000 -tenants 5000 -tenant-rounds 3 -pushback 2000 -shard 10000 -memory 100000 -syncloop $(BIN) -record bench/RESULTS.md

bench-full: testenv build ## the same with 10,000 triggers in process
	$(GO) run ./bench -n 10000 -engine-rounds 3 -fanout 10000 -rollout 10000 -identities 10 -chain 1000 -function 10000 -fleet 1000 -tenants 5000 -tenant-rounds 3 -pushback 2000 -shard 10000 -memory 100000 -syncloop $(BIN) -record bench/RESULTS.md

soak: testenv ## churn triggers and rules for DURATION (default 10m), printing memory and goroutines; not in CI
	$(GO) run ./hack/soak -duration $(or $(DURATION),10m)

robustness: test-robustness ## the leak and outage tests, then randomized fault campaigns judged by the API server's audit log, for DURATION (default 30m); SEED replays one
	$(GO) run ./hack/robustness -duration $(or $(DURATION),30m) $(if $(SEED),-seed $(SEED))

lint: ## gofmt check and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean: ## remove build output (the control plane cache stays: see hack/testenv.sh)
	rm -rf bin
