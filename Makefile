# Two set-up commands for a fresh machine: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck check bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m examples.demo

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check src tests examples
	$(BIN)/ruff format --check src tests examples

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache crash-matrix.json crash-matrix.md
