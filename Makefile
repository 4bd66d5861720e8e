# `make demo` and `make test` set themselves up: they create .venv if missing and install lvfl with its dev extra.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.lvfl-installed
DEMO_CONFIG ?= configs/easter/digits.yaml

.PHONY: demo test test-fast test-stress lint docs bench clean

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

# the fast tier: every test that starts no process of its own and fits no real model (tests/tiers.py): about 2.5 min
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not gpu"

# the deployment tests with every core busy and 0-50 ms of jitter on every launch (tests/stress.py); CI runs it
test-stress: $(STAMP)
	$(BIN)/python -m pytest --stress tests/test_federation_schedule.py tests/test_readme_tour.py

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
	$(BIN)/python -m benchmarks.paper.accuracy
	$(BIN)/python -m benchmarks.perf.overhead
	$(BIN)/python -m benchmarks.perf.backends

clean:
	rm -rf runs lightning_logs .pytest_cache site
