# Two commands set everything up on a fresh machine:
#   make test         install into .venv, lint, type-check, run every test
#   make bench-pi05   install into .venv, run the pi0.5 scenario, render results/pi05.*.png
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
TORCH_PIN := torch==2.13.0

.PHONY: install venv-tools test lint typecheck pytest bench-map bench-smoke bench-pi05 bench-pi05-trim plot clean-data \
	bench-smoke-compile bench-pi05-compile bench-lerobot-compile lerobot-venv budget-smoke budget-smoke-slurm budget-pi05 \
	budget-pi05-compile bench-smoke-openvino bench-pi05-compile-openvino bench-smoke-iree \
	bench-pi05-compile-iree gpu-peers gpu-peers-smoke bench-pi05-h200 bench-pi05-h200-peers bench-llama

# The command-line tools the README names, whose scripts must be in $(VENV)/bin.
VENV_TOOLS := pytest ruff mypy

$(STAMP): pyproject.toml
	$(MAKE) --no-print-directory venv-tools
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The venv, made if missing, with its own copy of each of VENV_TOOLS. --system-site-packages:
# a machine that already has torch (a CUDA image, say) keeps it. A tool the base Python has
# counts as installed there, so pip would write no script into $(VENV)/bin and an activated
# venv's `pytest` would be the base's, which imports no torch: --force-reinstall installs
# the tools into the venv all the same (replacing the venv's own copy cleanly on a rerun),
# --no-deps leaves their dependencies to the '.[dev]' install that follows.
venv-tools:
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q --force-reinstall --no-deps $(VENV_TOOLS)

install: $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check weightmap harness tests

typecheck: $(STAMP)
	$(PY) -m mypy weightmap harness

pytest: $(STAMP)
	$(PY) -m pytest -q tests harness/tests

test: lint typecheck pytest

bench-map: $(STAMP)
	$(PY) -m harness.bench_map $(BENCH_MAP_ARGS)

# The bench targets rewrite the committed results/<name>/ and its figures (review the diff).
# SMOKE_RESULTS: where bench-smoke writes (make bench-smoke SMOKE_RESULTS=/tmp/x: /tmp/x/smoke/ and its
# figures, the committed results/ untouched; .ci/run does so to gate memory against results/smoke).
SMOKE_RESULTS ?= results
bench-smoke: $(STAMP)
	$(PY) -m harness run scenarios/smoke.toml --results $(SMOKE_RESULTS)

bench-pi05: $(STAMP)
	$(PY) -m harness run scenarios/pi05.toml

bench-pi05-trim: $(STAMP)
	$(PY) -m harness run scenarios/pi05-trim.toml

# A real compiler (AOTInductor) on the CPU, every weight setting: engines that run on the
# mapped weights, engines that hold their weights written by the harness (streamed from the
# model's tensors), and engines whose weights AOTInductor packages itself.
bench-smoke-compile: $(STAMP)
	$(PY) -m harness run scenarios/smoke-compile.toml
	$(PY) -m harness run scenarios/smoke-compile-packaged.toml
	$(PY) -m harness run scenarios/smoke-compile-packaged-compiler.toml

# The synthetic transformer at pi0.5's layer shapes (8.64 GiB): minutes a strategy on 2 cores
# (pi05-compile-packaged: 8 minutes for map and load, their checks included).
bench-pi05-compile: $(STAMP)
	$(PY) -m harness run scenarios/pi05-compile.toml
	$(PY) -m harness run scenarios/pi05-compile-packaged.toml
	$(PY) -m harness run scenarios/pi05-compile-packaged-compiler.toml

# Llama-3.1-8B from a generated checkpoint sharded as transformers saves it (data/llama-3.1-8b, 16 GB),
# with the copy backend and compiled by AOTInductor; load is stopped at the memory limit on a 24 GiB machine,
# which makes each run exit with status 1 (a strategy failed): the second runs all the same (the leading -).
bench-llama: $(STAMP)
	-$(PY) -m harness run scenarios/llama-3-1-8b.toml
	-$(PY) -m harness run scenarios/llama-3-1-8b-compile-packaged.toml

# A second compiler, OpenVINO, on the CPU from the same graph partitions: each engine a compiled
# blob holding its weights. Its package comes with the test extra ('.[dev]'; '.[openvino]' alone).
# smoke-openvino: about 3 minutes on 2 cores; pi05-compile-openvino: the pi0.5-sized model, map and load.
bench-smoke-openvino: $(STAMP)
	$(PY) -m harness run scenarios/smoke-openvino.toml

bench-pi05-compile-openvino: $(STAMP)
	$(PY) -m harness run scenarios/pi05-compile-openvino.toml

# A third compiler, IREE, on the CPU (llvm-cpu) from the same graph partitions: each engine a .vmfb that
# reads the model's tensors as its parameters (smoke-iree, weights mapped) or holds them inlined
# (smoke-iree-packaged-compiler). Its packages come with the test extra ('.[dev]'; '.[iree]' alone), as
# OpenVINO's do, so that its tests run under `make test`. About a minute each.
bench-smoke-iree: $(STAMP)
	$(PY) -m harness run scenarios/smoke-iree.toml
	$(PY) -m harness run scenarios/smoke-iree-packaged-compiler.toml

# The pi0.5-sized model built by IREE, weights read as parameters (bfloat16 cannot be inlined).
bench-pi05-compile-iree: $(STAMP)
	$(PY) -m harness run scenarios/pi05-compile-iree.toml

# The GPU loader peers (optional; safetensors 0.9.0rc1 replaces 0.8 in .venv), then pi0.5 on a CUDA GPU
# with every strategy and peer (scenarios/pi05-h200.toml).
gpu-peers: $(STAMP)
	$(PY) -m pip install -q --pre 'safetensors==0.9.0rc1' 'fastsafetensors==0.5.0' 'instanttensor==0.2.2'

# Each GPU loader peer, per engine and over the whole checkpoint, on a small model (about two minutes).
gpu-peers-smoke: gpu-peers
	PY=$(PY) benchmarks/gpu_peers_smoke.sh

bench-pi05-h200: gpu-peers
	$(PY) -m harness run scenarios/pi05-h200.toml

# The same with map and the GPU loader peers alone (each in both uses): about 6 minutes on an H100.
bench-pi05-h200-peers: gpu-peers
	$(PY) -m harness run scenarios/pi05-h200-peers.toml

# lerobot's own pi0.5 compiled on a GPU; needs lerobot (LEROBOT_PY: a Python where it
# imports, e.g. the one `make lerobot-venv` sets up) and data/pi05.safetensors (make bench-pi05).
LEROBOT_PY ?= .venv-lerobot/bin/python
LEROBOT_SCENARIO ?= scenarios/lerobot-compile.toml
bench-lerobot-compile:
	$(LEROBOT_PY) -m harness run $(LEROBOT_SCENARIO)

# Optional: a Python 3.12 environment where lerobot 0.6.1 imports (torch < 2.12, transformers 5.5.x).
# PYTHON312 names the interpreter where python3.12 is not on PATH (under pyenv:
# PYTHON312="$$(pyenv root)/versions/3.12.1/bin/python3").
PYTHON312 ?= python3.12
lerobot-venv:
	test -x .venv-lerobot/bin/python || $(PYTHON312) -m venv .venv-lerobot
	.venv-lerobot/bin/python -m pip install -q 'torch==2.11.*' 'lerobot==0.6.1' 'transformers==5.5.4'
	.venv-lerobot/bin/python -m pip install -q -e '.[dev]'

# Re-render every results directory's figures and report from its record (runs nothing).
plot: $(STAMP)
	for d in results/*/; do $(PY) -m harness plot "$$d" || exit 1; done

clean-data:
	rm -rf data

# Budget sweeps: each strategy's smallest memory-cgroup limit (needs a writable memory cgroup; root here).
# They rewrite results/<name>-budget/ and its report; the pi0.5 sweep took about the time its report states.
# EXECUTOR=slurm: each attempt a job of the Slurm that SLURM_CONF names (or the default one), --mem its limit.
EXECUTOR ?= local
budget-smoke: $(STAMP)
	$(PY) -m harness budget scenarios/smoke.toml --timeout-factor 3 --executor $(EXECUTOR)

# The same sweep through a one-node Slurm started on this machine for it (installed where missing, as root),
# stopped after: results/smoke-budget-slurm, whose attempts name their jobs.
SLURM_DIR ?= /tmp/harness-slurm-budget
budget-smoke-slurm: $(STAMP)
	$(PY) -m harness.tests.slurm_cluster start $(SLURM_DIR)
	SLURM_CONF=$(SLURM_DIR)/slurm.conf $(PY) -m harness budget scenarios/smoke.toml --timeout-factor 3 \
		--executor slurm --name smoke-budget-slurm; status=$$?; \
		$(PY) -m harness.tests.slurm_cluster stop $(SLURM_DIR); exit $$status

budget-pi05: $(STAMP)
	$(PY) -m harness budget scenarios/pi05.toml --timeout-factor 3

# The pi0.5-sized model compiled by AOTInductor with engines that hold their weights: map
# bisected to 512 MiB (each attempt takes minutes on 2 cores), load run at one limit below
# the model's size (8 GiB) to show where it stands.
budget-pi05-compile: $(STAMP)
	$(PY) -m harness budget scenarios/pi05-compile-packaged.toml --precision-mib 512 --timeout-factor 3 --at load=8
