# atlas-lab: `make test` and friends work from a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: install test test-all demo ui bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# Keep a torch that is already installed (e.g. a CUDA build); otherwise take the pinned CPU-friendly release.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[dev]"
	touch $@

install: $(VENV)/.installed

test: $(VENV)/.installed
	$(PY) -m pytest -m "not slow" -q

test-all: $(VENV)/.installed
	$(PY) -m pytest -q

demo: $(VENV)/.installed
	$(VENV)/bin/atlas-lab sweep sweeps/demo.yaml --workers 2

ui: $(VENV)/.installed
	$(VENV)/bin/atlas-lab ui

bench: $(VENV)/.installed
	$(PY) benchmarks/memory_ops.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
