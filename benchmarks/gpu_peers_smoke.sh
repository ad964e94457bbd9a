#!/usr/bin/env bash
# Each GPU loader peer, both uses (per engine and the whole checkpoint in one open), beside map, on a
# small generated checkpoint built on a CUDA device through the harness: does each run, and what does
# it record? About two minutes on a CUDA machine with the three packages installed (make gpu-peers).
#
#   make gpu-peers && benchmarks/gpu_peers_smoke.sh [RESULTS_ROOT]
#
# RESULTS_ROOT (default: a new temporary directory) receives results/<name>/ as a run writes it; the
# script prints one line per strategy (status, wall time, host peak, anonymous peak, page-cache peak
# of the checkpoint, GPU peak) and exits 1 when any strategy failed, 2 when the machine cannot run them.
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
ROOT=${1:-$(mktemp -d -t gpu-peers-smoke.XXXXXX)}
mkdir -p "$ROOT"

STRATEGIES='"map", "st_prefetch", "st_prefetch_whole", "fastsafetensors", "fastsafetensors_whole", "instanttensor", "instanttensor_whole"'

"$PY" - <<'EOF' || exit 2
import importlib
import sys

import torch

if not torch.cuda.is_available():
    sys.exit("no CUDA device here: the GPU loader peers' smoke run needs one")
import safetensors

missing = [] if hasattr(safetensors.safe_open, "prefetch") else ["safetensors==0.9.0rc1 (--pre)"]
for package, version in (("fastsafetensors", "0.5.0"), ("instanttensor", "0.2.2")):
    try:
        importlib.import_module(package)
    except Exception:  # noqa: BLE001 - any failure to import is a missing package here
        missing.append(f"{package}=={version}")
if missing:
    sys.exit(f"missing: {', '.join(missing)}: run make gpu-peers")
EOF

cat > "$ROOT/gpu-peers-smoke.toml" <<EOF
name = "gpu-peers-smoke"
description = "GPU loader peers, per engine and whole checkpoint, on a small synthetic model copied to a CUDA GPU"
strategies = [$STRATEGIES]

[model]
source = "synthetic"
layers = 4
width = 512
heads = 8
vocab = 8192
dtype = "float32"

[checkpoint]
path = "$ROOT/gpu-peers-smoke.safetensors"
generate = true
seed = 0

[build]
engines = 4
backend = "copy"
device = "cuda"
release = true

[run]
cache = "cold"
sample_interval_ms = 10.0
residency_every = 1
timeout_s = 300
repeats = 1
warmup = 0
EOF

status=0
"$PY" -m harness run "$ROOT/gpu-peers-smoke.toml" --results "$ROOT/results" || status=$?
if [ "$status" -eq 2 ]; then
    exit 2
fi

"$PY" - "$ROOT/results/gpu-peers-smoke" <<'EOF'
import sys
from pathlib import Path

import pandas as pd

from harness.results.reading import load_results

directory = Path(sys.argv[1])
record = load_results(directory).record
gib = 1 << 30


def figure(value: float | None) -> str:
    return "-" if value is None else f"{value / gib:.3f}"


print(f"{'strategy':<24}{'status':<8}{'wall s':>8}{'host GiB':>10}{'anon GiB':>10}{'cache GiB':>10}{'GPU GiB':>9}")
for name, s in record.strategies.items():
    samples = directory / f"samples-{name}.csv"
    cache = pd.read_csv(samples)["resident_bytes"].max() if samples.exists() else None
    wall = "-" if s.wall_s is None else f"{s.wall_s:.1f}"
    print(f"{name:<24}{s.status:<8}{wall:>8}{figure(s.host_peak_bytes):>10}{figure(s.anon_peak_bytes):>10}"
          f"{figure(cache):>10}{figure(s.gpu_peak_bytes):>9}" + (f"  {s.error}" if s.error else ""))
print(f"results: {directory}")
EOF
exit "$status"
