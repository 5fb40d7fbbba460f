# The two commands of the README: `make train` and `make test`. Both bootstrap .venv first.
# `make help` lists every target.
VENV ?= .venv
PY := $(VENV)/bin/python
OVERRIDES ?=
# Without a CUDA GPU, `make train` and `make bench` run the CPU preset (experiment=cpu, < 10 min on 2
# cores): the train app adds it when no experiment is given, as `python -m nerf_lightning.train` does.
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
PYTEST_ARGS ?=
# Two pytest-xdist workers, each test file on one worker (its fixtures built once); TEST_WORKERS= runs
# the suite in one process.
TEST_WORKERS ?= -n 2 --dist loadfile
# make test-repro's tests are a few long trainings whose modules share little: tests, not whole files, go
# to the worker that is free (work stealing), so the walk's comparison (minutes) holds at most one test back
REPRO_WORKERS ?= -n 2 --dist worksteal
# `make bench`: seconds of training per time point, on a GPU and on the CPU preset without one.
GPU_CHECKPOINTS := 5,15,60,300
CPU_CHECKPOINTS := 20,40
BENCH_CHECKPOINTS ?= $(if $(HAS_GPU),$(GPU_CHECKPOINTS),$(CPU_CHECKPOINTS))
# `make bench-suite`: experiments of the benchmark runner (none: list them) and its options.
EXPERIMENTS ?=
SUITE_ARGS ?=

.PHONY: help setup train test test-repro test-timing test-cuda bench bench-ops bench-suite lint scene clean

$(VENV)/.installed: pyproject.toml scripts/bootstrap.sh
	VENV=$(VENV) bash scripts/bootstrap.sh

## Create .venv and install the project (the other targets do it first).
setup: $(VENV)/.installed

## Train on the embedded default scene (generated on first use, cached under outputs/scenes).
## Extra overrides: make train OVERRIDES="trainer.max_steps=5000"
train: setup
	$(PY) -m nerf_lightning.train $(OVERRIDES)

## CPU test suite, no assertion on the clock (at most 5 minutes on 2 idle cores; a test that hangs fails after 900 s); PYTEST_ARGS="-k resume" selects tests.
test: setup
	$(PY) -m pytest -q -m "not cuda and not repro and not timing" --durations 15 $(TEST_WORKERS) $(PYTEST_ARGS)

## Reproductions of real-capture failures on generated data and the longest end-to-end trainings (minutes on a CPU; CI runs them after `test`).
test-repro: setup
	$(PY) -m pytest -q -m "repro and not cuda" --durations 15 $(REPRO_WORKERS) $(PYTEST_ARGS)

## Speed and CPU-time assertions (marker timing): meaningful on an idle machine only (no other jobs, 2+ cores).
test-timing: setup
	$(PY) -m pytest -q -m "timing and not cuda" $(PYTEST_ARGS)

## GPU tests: run on a machine with an NVIDIA GPU.
test-cuda: setup
	$(PY) -m pytest -q -m cuda $(PYTEST_ARGS)

## Time to quality: held-out PSNR at 5/15/60/300 s of training on a GPU (20/40 s with the CPU preset
## without one): curve.json + curve.png under outputs/bench/curve.
## A capture and extra overrides: make bench OVERRIDES="experiment=blender data.path=/data/lego"
bench: setup
	$(PY) -m nerf_lightning.bench.curve --checkpoints $(BENCH_CHECKPOINTS) --profile-steps 50 -- $(OVERRIDES)

## The CUDA ops against the PyTorch reference, measured in the same run (needs a GPU).
bench-ops: setup
	$(PY) -m nerf_lightning.bench.ops

## The benchmark runner (benchmarks/, not installed): named experiments, time-boxed, one results table.
## make bench-suite EXPERIMENTS="cuda-tests lego-curve" SUITE_ARGS="--limit 540"; no EXPERIMENTS: the list
bench-suite: setup
	$(PY) -m benchmarks.suite $(if $(EXPERIMENTS),$(EXPERIMENTS),--list) $(SUITE_ARGS)

## Generate the default scene (outputs/scenes) and print its folder.
scene: setup
	$(PY) -c 'from nerf_lightning.data.synthetic import ensure_default_scene as e; print(e())'

## ruff over src, tests and benchmarks.
lint: setup
	$(PY) -m ruff check src tests benchmarks

## Remove outputs/ and pytest's cache.
clean:
	rm -rf outputs .pytest_cache

## This list.
help:
	@awk '/^## /{d = d (d ? "\n              " : "") substr($$0, 4); next} \
	     /^[a-z][a-z-]*:/{if (d) printf "%-13s %s\n", substr($$1, 1, length($$1) - 1), d} {d = ""}' $(MAKEFILE_LIST)
