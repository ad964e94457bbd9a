"""What an AOTInductor build on a GPU holds beside its weights, with each way of tuning its Triton kernels.

Builds a model whose largest weight is read by a Triton kernel: a gathered embedding table of
``--vocab`` x ``--width`` bfloat16 values (pi0.5's is 257,152 x 2,048: 0.98 GiB), an RMS norm and a
linear layer, its weights on the GPU. It is exported and compiled by AOTInductor (weights left out
of the shared library) in a fresh process per setting, each with an inductor cache of its own:

* ``compile-time``: AOTInductor's default, ``triton.autotune_at_compile_time`` on: the kernels are
  tuned on random tensors it allocates for every argument of every kernel, the weights included;
* ``two-pass``: the harness's setting on a GPU (``harness.engines.compile.inductor.GPU_CONFIGS``):
  the engine is run once on its own weights and inputs to tune them.

Per setting: the CUDA context (NVML ``used`` across the first allocation), the weights on the
device, and while the compiler ran: the caching allocator's allocated and reserved peaks above
what was allocated when it began, and NVML ``used`` above the process's start, sampled every 5 ms.
Compile times are printed too: one build each, the first of which may also warm caches shared
with the second (the machine's driver and Triton's own); run it again with ``--order`` reversed
before reading anything into them.

Needs a CUDA GPU, nvidia-ml-py and a C++ compiler for AOTInductor::

    python benchmarks/gpu_tuning_memory.py
    python benchmarks/gpu_tuning_memory.py --order two-pass,compile-time
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout: this harness, not an installed one

import torch  # noqa: E402

from harness.engines.compile.inductor import GPU_CONFIGS  # noqa: E402
from harness.measure.gpu import GpuMonitor  # noqa: E402

GIB = 2**30
SETTINGS: dict[str, dict[str, Any]] = {
    "compile-time": {"triton.autotune_at_compile_time": True},
    "two-pass": dict(GPU_CONFIGS),
}


class _Model(torch.nn.Module):
    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width, dtype=torch.bfloat16)
        self.scale = torch.nn.Parameter(torch.ones(width, dtype=torch.bfloat16))
        self.proj = torch.nn.Linear(width, width, dtype=torch.bfloat16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids).float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.proj((x * (1 + self.scale.float())).to(torch.bfloat16))


def _child(setting: str, vocab: int, width: int, tokens: int) -> dict[str, Any]:
    gpu = GpuMonitor.open(torch.cuda.current_device())
    if gpu is None:
        raise SystemExit("gpu_tuning_memory: NVML cannot read this GPU (nvidia-ml-py and an NVIDIA driver needed)")
    used = gpu.used_bytes
    start = used()
    torch.empty(1, device="cuda")
    context = used() - start
    with torch.device("cuda"):
        model = _Model(vocab, width).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = torch.randint(0, vocab, (1, tokens), device="cuda")
    with torch.no_grad():
        program = torch.export.export(model, (ids,))
    configs = {"aot_inductor.package_constants_in_so": False, **SETTINGS[setting]}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    allocated = torch.cuda.memory_allocated()
    peak = [used()]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], used())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as work, torch.no_grad():
        torch._inductor.aoti_compile_and_package(program, package_path=os.path.join(work, "e.pt2"),
                                                 inductor_configs=configs)
        seconds = time.perf_counter() - began
    done.set()
    sampler.join()
    gpu.close()
    return {
        "setting": setting, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
        "context_gib": context / GIB, "weights_gib": weights / GIB, "compile_s": seconds,
        "allocated_peak_gib": (torch.cuda.max_memory_allocated() - allocated) / GIB,
        "reserved_peak_gib": torch.cuda.max_memory_reserved() / GIB,
        "nvml_peak_gib": (peak[0] - start) / GIB,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=257_152)
    parser.add_argument("--width", type=int, default=2_048)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--order", default="compile-time,two-pass", help="settings, in the order they run")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.vocab, args.width, args.tokens)))
        return 0
    if not torch.cuda.is_available():
        print("gpu_tuning_memory: needs a CUDA GPU and a CUDA build of torch; this machine has none", file=sys.stderr)
        return 2
    order = [s.strip() for s in args.order.split(",") if s.strip()]
    unknown = [s for s in order if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}: expected {', '.join(SETTINGS)}")
    rows = []
    for setting in order:
        child = [sys.executable, __file__, "--child", setting, "--vocab", str(args.vocab), "--width", str(args.width),
                 "--tokens", str(args.tokens)]
        done = subprocess.run(child, capture_output=True, text=True, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            print(f"{setting}: failed (exit {done.returncode})\n{done.stderr[-2000:]}", file=sys.stderr)
            return 1
        rows.append(json.loads(lines[-1]))
    print(f"{rows[0]['device']}, torch {rows[0]['torch']}; GiB; compile time: one build each\n")
    print(f"{'setting':<14}{'context':>9}{'weights':>9}{'allocated peak':>16}{'reserved peak':>15}"
          f"{'NVML peak':>11}{'compile s':>11}")
    for r in rows:
        print(f"{r['setting']:<14}{r['context_gib']:>9.3f}{r['weights_gib']:>9.3f}{r['allocated_peak_gib']:>16.3f}"
              f"{r['reserved_peak_gib']:>15.3f}{r['nvml_peak_gib']:>11.3f}{r['compile_s']:>11.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
