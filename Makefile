# The two set-up commands: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_QUESTION := What learning rate is used to train QuantLens?

.PHONY: demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/explorer corpus stats
	$(BIN)/explorer corpus search "$(DEMO_QUESTION)" -k 5
	$(BIN)/explorer run --out runs/demo

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -n auto --dist loadscope  # one worker per core; a module's tests share one

bench: $(VENV)/.installed-dev
	$(BIN)/python bench/search.py
	$(BIN)/python bench/sandbox.py
	$(BIN)/python bench/episodes.py
	$(BIN)/python bench/concurrency.py
	$(BIN)/python bench/kv_cache.py

clean:
	rm -rf $(VENV) .pytest_cache runs
