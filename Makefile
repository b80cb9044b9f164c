# Two set-up commands for a fresh machine: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck check bench clean
BENCH_VENV := .venv-bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# The crash matrix over examples/ on the embedded backends (+ PostgreSQL/Redis when their env vars are set).
DEMO_BACKENDS = memory,sqlite$${REPLAYSAFE_PG_DSN:+,postgres}$${REPLAYSAFE_REDIS_URL:+,postgres+redis}

demo: $(STAMP)
	$(BIN)/python -m pytest examples -p no:cacheprovider -q -rfE -n 2 --crash-matrix \
		--crash-backends=$(DEMO_BACKENDS) --crash-report=crash-matrix.json --crash-markdown=crash-matrix.md

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup -p no:cacheprovider

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
	$(BENCH_VENV)/bin/python -m pip install --quiet -e ".[dev,bench]"
	touch $@

bench: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python -m benchmarks.bench

clean:
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache .mypy_cache .ruff_cache crash-matrix.json crash-matrix.md
