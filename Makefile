# Two set-up commands for a fresh machine: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
# The demo installs the PostgreSQL/Redis drivers only when it will use them.
DEMO_EXTRA := $(if $(REPLAYSAFE_PG_DSN)$(REPLAYSAFE_REDIS_URL),ci,demo)
DEMO_STAMP := $(VENV)/.installed-$(DEMO_EXTRA)

.PHONY: help demo test gate gate-merge lint typecheck check bench clean
BENCH_VENV := .venv-bench

# uv when it is on PATH (fastest); else pip: the interpreter's own pip installs into a venv made without one
# (pip >= 22.3, skips ensurepip's seconds), or the venv's pip where the interpreter has none.
UV := $(shell command -v uv 2>/dev/null)
ifneq ($(UV),)
INSTALLER := uv
MKVENV    := $(UV) venv --quiet --python $(PYTHON) $(VENV)
INSTALL   := $(UV) pip install --python $(BIN)/python
REMOVE    := $(UV) pip uninstall --quiet --python $(BIN)/python
else ifeq ($(shell $(PYTHON) -m pip --python $(PYTHON) --version >/dev/null 2>&1 && echo yes),yes)
INSTALLER := pip
MKVENV    := $(PYTHON) -m venv --without-pip $(VENV)
INSTALL   := $(PYTHON) -m pip --python $(BIN)/python install
REMOVE    := $(PYTHON) -m pip --python $(BIN)/python uninstall --quiet --yes
else
INSTALLER := pip
MKVENV    := $(PYTHON) -m venv $(VENV)
INSTALL   := $(BIN)/python -m pip install
REMOVE    := $(BIN)/python -m pip uninstall --quiet --yes
endif
# The distribution was called 10xgraph until 0.1 (the package index's 10xgraph is another project): a .venv made
# before then drops it, or pytest would load the plugin twice.
OLD_DIST  = $(if $(wildcard $(VENV)/lib/python*/site-packages/10xgraph-*.dist-info),$(REMOVE) 10xgraph;,)

$(BIN)/python:
	@echo "[setup] creating $(VENV) ($(INSTALLER))"
	@$(MKVENV)

# The demo needs only the package, pytest and xdist (and drivers for PostgreSQL); `make test` adds the rest.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	@echo "[setup] installing tenxgraph[$(DEMO_EXTRA)] into $(VENV) with $(INSTALLER) (first run only)"
	@$(OLD_DIST) $(INSTALL) --quiet -e ".[$(DEMO_EXTRA)]"
	@touch $@

$(STAMP): pyproject.toml | $(BIN)/python
	@echo "[setup] installing tenxgraph[dev] into $(VENV) with $(INSTALLER): tests, linters, providers"
	@$(OLD_DIST) $(INSTALL) --quiet -e ".[dev]"
	@touch $(STAMP) $(VENV)/.installed-demo $(VENV)/.installed-ci

# The crash matrix over examples/ on the embedded backends (+ PostgreSQL/Redis when their env vars are set).
DEMO_BACKENDS = memory,sqlite$${REPLAYSAFE_PG_DSN:+,postgres}$${REPLAYSAFE_REDIS_URL:+,postgres+redis}

# What each target does.
help:
	@echo "make demo       the crash matrix over examples/ on the embedded backends (no server; about 20 s)"
	@echo "make test       the whole suite (PostgreSQL and Redis through REPLAYSAFE_PG_DSN / REPLAYSAFE_REDIS_URL)"
	@echo "make gate       the whole product: every mode, point, fault and backend, and depth 2 (what CI runs);"
	@echo "                GATE_SHARD=K/N runs shard K of N of it (on machine K of N)"
	@echo "make gate-merge every shard's gate report into gate.json (GATE_SHARDS=N)"
	@echo "make bench      ours against LangGraph, shape by shape, and the server under chaos (docs/benchmarks.md)"
	@echo "make lint       ruff check and format check;  make typecheck: mypy --strict;  make check: all three"
	@echo "make clean      remove the venvs and the reports"

# Every crash point and mode once per test (each point's first hit): the rest of the matrix is `make gate`'s.
demo: $(DEMO_STAMP)
	@echo "[demo] the crash matrix over examples/ on $(DEMO_BACKENDS), each point's first hit"
	@$(BIN)/python -m pytest examples -p no:cacheprovider -rfE -n 2 --crash-matrix --crash-hits=1 \
		--crash-backends=$(DEMO_BACKENDS) --crash-report=crash-matrix.json --crash-markdown=crash-matrix.md \
		--crash-html=crash-matrix.html

# The whole product, as CI runs it: every mode at every point (in-process, SIGKILL, stream, the contest, recovery,
# prune, double-resume, resumers), every storage fault, the budgeted contests at every lock window, over every example on
# every backend that is configured, and crashes during recovery (depth 2, within the default budget) in the modes that
# have them, in one run (a depth-2 run runs every depth-1 cell first: a second run for depth 2 ran those twice). The
# seed is fixed: compare two commits with `python -m pytest_replaysafe compare A.json B.json`.
# Over several machines: `make gate GATE_SHARD=K/N` on machine K (each writes gate-K-of-N.json), then
# `make gate-merge GATE_SHARDS=N` on one that has every shard's report: gate.json, as one machine writes it
# (docs/crash-matrix.md, "Beyond one machine").
GATE_SEED    ?= 1
GATE_SHARD   ?=
GATE_SHARDS  ?=
GATE_REPORT  ?= $(if $(GATE_SHARD),gate-$(subst /,-of-,$(GATE_SHARD)).json,gate.json)
# 4 xdist workers on 2 cores: the cells wait much of their time (an outage's retries, a drop's terminated
# backends, a killed child's reaping), which left half the cores idle at 2 workers (docs/crash-matrix.md).
GATE_WORKERS ?= 4
GATE_SPLIT    = $(if $(GATE_SHARD),--crash-shard=$(GATE_SHARD))
gate: $(STAMP)
	PYTEST_ADDOPTS="$${PYTEST_ADDOPTS:-} -p no:langsmith_plugin" $(BIN)/python -m pytest examples -p no:cacheprovider \
		-q -n $(GATE_WORKERS) --crash-matrix --crash-backends=$(DEMO_BACKENDS) --crash-modes=all --crash-depth=2 \
		--crash-seed=$(GATE_SEED) --crash-report=$(GATE_REPORT) --crash-progress=off $(GATE_SPLIT)

gate-merge: $(STAMP)
	@test -n "$(GATE_SHARDS)" || { echo "make gate-merge GATE_SHARDS=N: how many shards ran (make gate GATE_SHARD=K/N)"; exit 2; }
	$(BIN)/python -m pytest_replaysafe merge $(foreach k,$(shell seq $(GATE_SHARDS)),gate-$(k)-of-$(GATE_SHARDS).json) \
		--out gate.json

# langsmith (which langgraph brings) registers a pytest plugin that costs 1-3 s at every pytest start; the suite
# starts pytest about 150 times (matrices in processes of their own), so its runs go without it.
TEST_WORKERS ?= 2
test: $(STAMP)
	PYTEST_ADDOPTS="$${PYTEST_ADDOPTS:-} -p no:langsmith_plugin" $(BIN)/python -m pytest -n $(TEST_WORKERS) \
		--dist loadgroup -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/ruff format --check src tests examples benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

# Ours vs LangGraph, in a venv of its own (LangGraph's dependencies stay out of the test venv).
$(BENCH_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	-$(BENCH_VENV)/bin/python -m pip uninstall --quiet --yes 10xgraph 2>/dev/null
	$(BENCH_VENV)/bin/python -m pip install --quiet -e ".[dev,bench]"
	touch $@

# Every shape side by side with LangGraph (PostgreSQL rows with REPLAYSAFE_PG_DSN, Redis with REPLAYSAFE_REDIS_URL);
# DBOS Transact beside it; all figures end up in benchmarks/results.json, and the last step prints each target
# with its median, min, load and met or missed. Figures, not pass/fail: see docs/benchmarks.md.
bench: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python -m benchmarks.bench
	$(BENCH_VENV)/bin/python -m benchmarks.parallel
	$(BENCH_VENV)/bin/python -m benchmarks.turns
	$(BENCH_VENV)/bin/python -m benchmarks.floor
	$(BENCH_VENV)/bin/python -m benchmarks.observe
	$(BENCH_VENV)/bin/python -m benchmarks.budgets
	$(BENCH_VENV)/bin/python -m benchmarks.tool_node
	$(BENCH_VENV)/bin/python -m benchmarks.dbos_peer
	$(BENCH_VENV)/bin/python -m benchmarks.pydantic_ai_peer
	if [ -n "$${REPLAYSAFE_PG_DSN:-}" ] && [ -n "$${REPLAYSAFE_REDIS_URL:-}" ]; then \
		$(BENCH_VENV)/bin/python -m benchmarks.redis_cache; fi
	if [ -n "$${REPLAYSAFE_PG_DSN:-}" ]; then $(BENCH_VENV)/bin/python benchmarks/server_chaos.py 500; fi
	$(BENCH_VENV)/bin/python -m benchmarks.collect

clean:
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache .mypy_cache .ruff_cache crash-matrix.json crash-matrix.md crash-matrix.html crash-matrix-depth2.json langgraph-matrix.json gate.json gate-depth2.json gate-*-of-*.json
