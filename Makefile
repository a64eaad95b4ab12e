# Every routine task of Basecamp is a target here. `make help` lists them.
#
# Set-up on a fresh machine needs only Rust (rustup) and make: `make demo`
# runs the main job, `make test` runs the tests (what CI runs, via .ci/run).

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo
# Slow-to-build things (cargo target in CI, cluster binaries later) live here, outside the clone.
BASECAMP_CACHE ?= $(HOME)/.cache/basecamp
TARGET_DIR := $(shell $(CARGO) metadata --format-version 1 --no-deps 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' 2>/dev/null || echo target)
BIN_DIR := $(TARGET_DIR)/debug
DEMO_DIR ?= $(TARGET_DIR)/demo
IMAGE ?= basecamp:dev
E2E_DIR ?= $(or $(TMPDIR),/tmp)/basecamp-e2e

.PHONY: test-deps help build test lint fmt fmt-check clippy doc unit cuda-emulate crds crds-check chart-lint e2e e2e-cluster e2e-cluster-down e2e-cluster-smoke bench-operator bench bench-trace bench-sandbox bench-exec bench-rate-limits bench-logits bench-search bench-serve demo demo-trace browser image fuzz prune clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## Build the three binaries (debug)
	$(CARGO) build --workspace --bins

test: lint test-deps unit cuda-emulate crds-check chart-lint ## Everything CI checks: format, clippy, rustdoc, unit/integration tests, the CUDA kernels on the CPU emulator, CRD drift, the Helm chart

lint: fmt-check clippy doc

fmt: ## Format the code
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

doc: ## The API docs (target/doc), every intra-doc link resolved: rustdoc warnings are errors
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

test-deps: ## Build the real test servers the tests start (s3s-fs), cached in $(BASECAMP_CACHE); pyarrow (the tests' Parquet reader) in a venv there; Debian's chromium for the browser tests
	bash scripts/s3-server.sh install
	BASECAMP_CACHE=$(BASECAMP_CACHE) bash scripts/pyarrow.sh install
	bash scripts/browser.sh install

browser: ## Debian's chromium for the browser tests of the report and serve
	bash scripts/browser.sh install

unit: ## Unit and integration tests of every crate
	$(CARGO) test --workspace

cuda-emulate: ## The CUDA kernels (gpu/src/cuda/logits.cu) compiled as C++ and held to the float64 oracle on the CPU (no GPU needed; 3-5 min on 2 cores)
	bash gpu/bench/emulate/run.sh

crds: ## Regenerate crds/ (and the chart's copy) from the Rust types in api/
	$(CARGO) run -q -p basecamp-operator -- crdgen --out crds
	bash scripts/chart-tools.sh sync-crds

crds-check: ## Fail when crds/ differs from what the Rust types generate
	$(CARGO) run -q -p basecamp-operator -- crdgen --check crds

chart-lint: ## Lint and validate the Helm chart offline: helm lint, kubernetes-validate, promtool, a loopback Prometheus (tools cached in $(BASECAMP_CACHE)/tools)
	BASECAMP_CACHE=$(BASECAMP_CACHE) bash scripts/chart-lint.sh

e2e-cluster: ## Start the real control plane (etcd, kube-apiserver, scheduler, controller-manager, kwok GPU nodes) in $(E2E_DIR), building it first (cached)
	BASECAMP_CACHE=$(BASECAMP_CACHE) bash e2e/cluster/up.sh $(E2E_DIR)
	@echo "use it: source $(E2E_DIR)/env"

e2e-cluster-down: ## Stop the control plane started by e2e-cluster
	bash e2e/cluster/down.sh $(E2E_DIR)

e2e-cluster-smoke: ## Bounded self-test of the control plane: GPU affinity scheduling, playing kwok pods
	BASECAMP_CACHE=$(BASECAMP_CACHE) bash e2e/cluster/smoke.sh

e2e: ## End-to-end tests on the real control plane: helm install + RBAC, the real operator as its ServiceAccount, GPU scheduling, pods played by the real sandbox against s3s-fs, Prometheus, restarts
	BASECAMP_CACHE=$(BASECAMP_CACHE) bash scripts/e2e.sh

bench-operator: ## 1,000 HarnessTasks at once on the real control plane: time to every Job, reconcile p50/p99, peak RSS (bench/results/operator.json)
	BASECAMP_CACHE=$(BASECAMP_CACHE) BASECAMP_E2E_BENCH=1 bash scripts/e2e.sh -k scale

bench: bench-trace bench-sandbox bench-exec bench-rate-limits bench-logits bench-search bench-serve ## Every benchmark; results under bench/results/

bench-trace: ## Trace write/read throughput, delta vs snapshot size, zstd vs gzip
	$(CARGO) bench -p basecamp-trace --bench trace

bench-sandbox: ## Executor overhead vs a direct call, timeout lateness, episodes/s
	$(CARGO) bench -p basecamp-sandbox --bench sandbox

bench-exec: ## An exec tool call (its process-group keeper included) vs spawning the same program directly
	$(CARGO) bench -p basecamp-sandbox --bench exec

bench-rate-limits: ## A shard against a loopback endpoint that answers 429 beyond its limit: the throttle vs retries alone vs a run at capacity (about 2 minutes)
	$(CARGO) bench -p basecamp-sandbox --bench rate_limits

bench-search: ## trace search over >= 1 GB of traces vs the same traces as JSON Lines filtered by jq (about 4 minutes)
	$(CARGO) bench -p basecamp-trace --bench search

bench-serve: ## basecamp serve over 2,000 traces: a warm task page from the kept catalog vs a full rescan (bench/results/serve.json)
	$(CARGO) bench -p basecamp-cli --bench serve

bench-logits: ## CPU logit analytics (fused vs scalar loop); the GPU run is gpu/bench/run_device.sh
	$(CARGO) bench -p basecamp-gpu --bench logits

demo: ## The main job: run the e-commerce A/B example locally (no cluster), summary table + report.html
	$(CARGO) run -q -p basecamp-cli -- run examples/ecommerce --out $(DEMO_DIR)/ecommerce

demo-trace: ## Write a realistic synthetic episode and read it back with `basecamp trace parse`
	mkdir -p $(DEMO_DIR)
	$(CARGO) run -q -p basecamp-trace --example synthetic_episode -- $(DEMO_DIR)/episode.trace 42 50
	$(CARGO) run -q -p basecamp-cli -- trace parse $(DEMO_DIR)/episode.trace > $(DEMO_DIR)/episode.json
	@python3 -c 'import json,sys,collections; d=json.load(open(sys.argv[1])); \
	c=collections.Counter(next(k for k in r if k != "step") for r in d["records"]); \
	print("read back", d["file"], "complete:", d["complete"]); \
	[print(f"  {k:16} {v}") for k,v in sorted(c.items())]' $(DEMO_DIR)/episode.json
	@echo "full JSON: $(DEMO_DIR)/episode.json"

fuzz: ## A bounded fuzzing run of the trace reader (FUZZ_SECONDS, default 60)
	bash trace/fuzz/run.sh

image: ## Build the container image with the three binaries (needs a Docker engine)
	docker build -t $(IMAGE) .

prune: ## Delete superseded test/bench executables from the cargo target directory (it otherwise grows by GBs a week)
	bash scripts/prune-target.sh "$${CARGO_TARGET_DIR:-target}"

clean:
	$(CARGO) clean
