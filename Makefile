# meshfed — see README.md. Every target runs from a fresh clone with only Go installed,
# except `proto` (and the proto half of `verify`), which needs Debian's protobuf-compiler.
SHELL := /bin/bash
GO ?= go
FUZZTIME ?= 30s
BENCHTIME ?= 1x
PKGS := ./...
# VERSION names the build in `hub version`, `minion version` and meshfed_build_info: the
# nearest tag and the commits since it, else the commit (the toolchain records the revision too).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)

.PHONY: help build demo testbins test test-e2e bench fuzz lint proto verify

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

build: ## compile every package, and the hub and minion into bin/ (hub version prints VERSION and the commit)
	$(GO) build $(PKGS)
	$(GO) build -buildvcs=true -ldflags "-X github.com/meshfed/meshfed/internal/buildinfo.Version=$(VERSION)" -o bin/ ./cmd/hub ./cmd/minion

demo: ## a hub (development CA), two minions and a sink on 127.0.0.1; Ctrl-C stops it
	./hack/demo.sh

testbins: ## build (or find cached) kube-apiserver, etcd, Istio's MCP peer and istiod (pilot-discovery) in .cache/bin
	$(GO) run ./internal/testkit/testbin/build

test: testbins ## every test tier, with -race: unit, real gRPC, real kube-apiserver, Istio interop, the monitoring pack (the CI command)
	$(GO) test -race -count=1 -timeout 30m $(PKGS)
	cd test/monitoring && $(GO) test -race -count=1 -timeout 10m ./...  # its own module: Prometheus' rule and PromQL parsers

test-e2e: testbins ## make test plus tests behind the e2e build tag (multi-process tests already run in make test)
	$(GO) test -race -count=1 -timeout 30m -tags e2e $(PKGS)

bench: testbins ## benchmark tables (with same-run baselines; versus: meshfed, Istio's own MCP server and bare gRPC as processes) and Go benchmarks
	$(GO) run ./cmd/mcpbench
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./mcp/... ./minion/...
	$(GO) test -run '^$$' -bench BenchmarkChangeToIstiod -benchtime 1x -v ./test/istiod | grep -E 'Benchmark|p50'  # a real istiod: relay, direct, and the MCP sink baseline

fuzz: ## run every fuzz target for FUZZTIME each
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

lint: ## go vet and a gofmt check
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

proto: ## regenerate mcp/v1alpha1 from mcp.proto (pinned protoc and plugins)
	./hack/proto.sh

verify: ## fail when generated code, go.mod or go.sum are stale
	$(GO) mod tidy -diff
	cd test/monitoring && $(GO) mod tidy -diff  # its own module, whose go.sum follows the root's go.mod
	./hack/proto.sh
	@git diff --exit-code -- mcp/v1alpha1 || { echo "generated code is stale: run make proto and commit"; exit 1; }
