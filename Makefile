# `make demo` and `make test` set themselves up: they create .venv if missing and install lvfl with its dev extra.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.lvfl-installed
DEMO_CONFIG ?= configs/easter/digits.yaml

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev,tensorboard]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/lvfl fit --config $(DEMO_CONFIG)
	$(BIN)/lvfl test --config $(DEMO_CONFIG) --ckpt_path last

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check lvfl tests benchmarks
	$(BIN)/ruff format --check lvfl tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/accuracy.py
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/backends.py

clean:
	rm -rf runs lightning_logs .pytest_cache
