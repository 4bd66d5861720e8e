# `make demo` and `make test` set themselves up: they create .venv if missing and install lvfl with its dev extra.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.lvfl-installed
DEMO_CONFIG ?= configs/easter/digits.yaml

.PHONY: demo test lint docs bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "lvfl: installing lvfl and its dependencies into $(VENV) (the first time downloads PyTorch: several minutes)"
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar on -e '.[dev,tensorboard]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/lvfl fit --config $(DEMO_CONFIG)
	$(BIN)/lvfl test --config $(DEMO_CONFIG) --ckpt_path last

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check lvfl tests benchmarks
	$(BIN)/ruff format --check lvfl tests benchmarks
	$(BIN)/python tests/layer_contract.py

# the documentation site, into site/ (open site/index.html); --strict: a broken link, anchor or API reference fails.
# Installs the docs extra the first time.
docs: $(STAMP)
	@$(BIN)/python -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null || \
		$(BIN)/python -m pip install --quiet -e '.[dev,tensorboard,docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/accuracy.py
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/backends.py

clean:
	rm -rf runs lightning_logs .pytest_cache site
