# atlas-lab: `make test` and friends work from a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: install system-deps test test-all test-numerics demo ui bench bench-tiny gpu-check clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# Keep a torch that is already installed (e.g. a CUDA build); otherwise take the pinned CPU-friendly release.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install torch==2.13.0
	# A constraints file pins the torch now installed, so no dependency can replace it (litdata wants torchvision,
	# whose newest release wants the newest torch).
	$(PY) -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/torch-constraints.txt
	$(PY) -m pip install -c $(VENV)/torch-constraints.txt -e ".[dev]"
	# PyPI's torchvision for a CPU torch may be a build whose operators do not register beside it ("operator
	# torchvision::nms does not exist"); torchmetrics imports torchvision when present, so such a torchvision would
	# break every run. atlas-lab does not use it (litdata's token path does not import it): remove it if it fails.
	$(PY) -c "import torchvision" 2>/dev/null || $(PY) -m pip uninstall -y -q torchvision
	touch $@

install: $(VENV)/.installed

# The system packages the tests start, installed by this step and only here (a test never installs anything; one
# whose part is missing fails with a line naming it): Debian's PostgreSQL server binaries (the PostgreSQL tests start
# a server of their own) and Chromium (the UI test drives it headless through Playwright). `make test` runs it first.
# Found as the tests find them (initdb on PATH or in Debian's folder; chromium on PATH); both there: nothing done.
# Missing, as root: apt-get installs them, saying which. Missing, as another user: one line naming the command, and
# make stops (before the tests).
SYSTEM_PACKAGES := postgresql chromium
HAVE_POSTGRESQL ?= $(shell command -v initdb || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null)
HAVE_CHROMIUM   ?= $(shell command -v chromium)
USER_ID         ?= $(shell id -u)
SYSTEM_MISSING   = $(strip $(if $(HAVE_POSTGRESQL),,postgresql) $(if $(HAVE_CHROMIUM),,chromium))

system-deps:
	$(if $(SYSTEM_MISSING),$(if $(filter 0,$(USER_ID)),,$(error system-deps: $(SYSTEM_MISSING) missing, which the \
	  tests start; install as root: sudo make system-deps)))
	@if [ -z "$(SYSTEM_MISSING)" ]; then echo "system-deps: $(SYSTEM_PACKAGES) installed"; exit 0; fi; \
	echo "system-deps: installing $(SYSTEM_MISSING) (apt-get install, as root)"; \
	export DEBIAN_FRONTEND=noninteractive; apt-get update -q && apt-get install -y -q $(SYSTEM_MISSING)

test: system-deps $(VENV)/.installed
	$(PY) -m ruff check .
	OMP_NUM_THREADS=1 $(PY) -m pytest -m "not slow" -q -n 3 --dist worksteal --durations=30

# The float32 equivalence and identity tests under each of MKL's code paths (the default one this processor picks,
# COMPATIBLE, AVX2) and with 1 and 2 threads: the rounding of another machine, on this one. With 2 threads, one
# pytest worker, so that the threads are not oversubscribed.
NUMERICS_TESTS := tests/memory/test_memory_equivalence.py tests/memory/test_memory_identities.py tests/kernels/test_kernels.py

test-numerics: $(VENV)/.installed
	set -e; for cbwr in default COMPATIBLE AVX2; do for threads in 1 2; do \
	  echo "== MKL_CBWR=$$cbwr OMP_NUM_THREADS=$$threads"; \
	  if [ $$cbwr = default ]; then unset MKL_CBWR; else export MKL_CBWR=$$cbwr; fi; \
	  OMP_NUM_THREADS=$$threads $(PY) -m pytest -m "not slow" -q -n $$((3 - threads)) $(NUMERICS_TESTS); \
	done; done

test-all: $(VENV)/.installed
	$(PY) -m pytest -q

# The demo (README.md): the capacity probe's table; 10 trained models (sweeps/demo.yaml: 2 points x 5 seeds, 2
# workers), their log in runs/demo/sweep.log; the report with power and cost (runs/demo/report.txt, every table whole
# in runs/sweeps/demo-recall/results.md); then one table of 80 columns, the verdict and runs/sweeps/demo-recall/demo.png
# (trained accuracy and the probe's curve against state size).
demo: $(VENV)/.installed
	@mkdir -p runs/demo
	$(VENV)/bin/atlas-lab capacity sweeps/capacity/demo.yaml
	@echo "training 10 models (the delta rule with memory heads of 16 and of 32 dims; 5 seeds each) on 2 workers," \
	      "1,500 steps each: progress in runs/demo/sweep.log"
	$(VENV)/bin/atlas-lab sweep sweeps/demo.yaml --workers 2 > runs/demo/sweep.log 2>&1 \
	    || { tail -n 40 runs/demo/sweep.log; exit 1; }
	$(VENV)/bin/atlas-lab report demo-recall --power 0.05 --cost > runs/demo/report.txt
	$(PY) docs/results/demo_summary.py

ui: $(VENV)/.installed
	$(VENV)/bin/atlas-lab ui

# Optional peers of the benchmarks, installed into the venv only by `make bench`: titans-pytorch 0.5.5
# (deps: assoc-scan, axial-positional-embedding, einops, einx, hyper-connections, ninja, rotary-embedding-torch,
# tensordict, torch>=2.8, tqdm, x-transformers) and fla-core. A constraints file pins torch to the version already
# installed, so pip can never replace it (a CUDA build stays a CUDA build); if a peer cannot live with that torch,
# pip fails instead of swapping it.
BENCH_PEERS ?= titans-pytorch==0.5.5 fla-core
BENCHMARKS  := memory_ops newton_schulz_cpu titans_layer deltanet models memory_scaling streaming_memory long_context swa \
               launches chunk_read prepare fit_steps cpu_step

$(VENV)/.bench-peers: $(VENV)/.installed
	$(PY) -m pip install -c $(VENV)/torch-constraints.txt $(BENCH_PEERS)
	touch $@

# Every benchmark at full size, one after another (long on a CPU; see benchmarks/README.md).
# Results: runs/bench/<name>.json.
bench: $(VENV)/.bench-peers
	set -e; for b in $(BENCHMARKS); do echo "== benchmarks/$$b.py"; $(PY) benchmarks/$$b.py; done

# The GPU path in one run of at most 8 minutes (tests on cuda, kernel timings, 125M-class training steps, the pilot of
# sweeps/mqar_gpu.yaml and its projected hours, and each measured step beside the GPU model's prediction, its constants
# refitted to the pilot: benchmarks/gpu_model.py): runs/bench/gpu_check.json. Without CUDA: the same code at tiny shapes
# on the CPU (gpu_check.cpu.json). Installs nothing: it runs with the venv's python where there is one, else
# $(PYTHON) as it is (a bare CUDA image with torch, lightning, triton, numpy, pyyaml, rich and pytest is enough).
GPU_CHECK_PY := $(if $(wildcard $(PY)),$(PY),$(PYTHON))

gpu-check:
	$(GPU_CHECK_PY) benchmarks/gpu_check.py

# The same scripts with --tiny (tiny shapes, 1 repeat, 1 thread): checks that each runs, in well under a minute each;
# the times mean nothing. A missing peer is reported and its column skipped. Results: runs/bench/<name>.tiny.json.
bench-tiny: $(VENV)/.installed
	set -e; for b in $(BENCHMARKS); do echo "== benchmarks/$$b.py --tiny"; $(PY) benchmarks/$$b.py --tiny; done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
