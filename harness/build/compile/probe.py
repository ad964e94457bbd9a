"""Measure one compile of a synthetic transformer: export, partition, AOTInductor per engine, check.

``python -m harness.build.compile.probe --mib 200 --parts 4 --weights mapped --work DIR``

builds a :class:`~harness.models.SyntheticTransformer` of about ``--mib`` MiB of weights
(layers added at the given width until the size is reached), writes its seeded checkpoint
under ``DIR`` once (reused by later runs), maps it, exports it, cuts the program into about
``--parts`` engines, compiles them in order with AOTInductor, releasing each weight after
the last engine that reads it, then loads the engines and compares their output with the
eager model's. It prints one row per engine and writes the figures as JSON (``--json``).

Run one weight setting per process: the per-engine peaks are the process's own
high-water mark, and a previous build would leave its memory behind.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from harness.build.compile.compare import compare_with_eager
from harness.build.compile.export import export_mapped
from harness.build.compile.graph_partition import partition_program, program_weight_bytes
from harness.build.compile.inductor import WEIGHTS, InductorCompiler
from harness.build.compile.pipeline import EngineRecord, build_engines
from harness.measure.coldcache import prepare_cold
from harness.measure.procfs import read_status
from harness.models import SyntheticTransformer, fill_non_persistent
from harness.models.checkpoints import ensure_checkpoint
from weightmap import ReleasePlan, ReleaseStep, map_weights

MIB = 2**20


def layers_for(mib: float, *, width: int, vocab: int, ffn_mult: int, dtype: torch.dtype) -> int:
    """Layers that bring the model closest to ``mib`` MiB (at least one)."""
    item = torch.empty((), dtype=dtype).element_size()
    per_layer = SyntheticTransformer.expected_numel(layers=1, width=width, vocab=0, ffn_mult=ffn_mult) - width
    rest = SyntheticTransformer.expected_numel(layers=0, width=width, vocab=vocab, ffn_mult=ffn_mult)
    return max(1, round((mib * MIB / item - rest) / per_layer))


def _mib(value: int | None) -> str:
    return "—" if value is None else f"{value / MIB:.1f}"


def table(records: list[EngineRecord], steps: list[ReleaseStep]) -> str:
    """The per-engine figures as a Markdown table (MiB, seconds)."""
    head = ("| engine | weights MiB | compile s | artifact MiB | VmHWM MiB | floor MiB | over floor MiB "
            "| children MiB | cache MiB | read MiB | released MiB |")
    rows = [head, "|" + " ---: |" * 11]
    for r, s in zip(records, steps, strict=True):
        rows.append(
            f"| {r.index} | {_mib(r.weight_bytes)} | {r.compile_s:.1f} | {_mib(r.artifact_bytes)} "
            f"| {_mib(r.host_hwm_bytes)} | {_mib(r.rss_before_bytes + r.weight_bytes)} "
            f"| {_mib(r.peak_over_floor_bytes)} | {_mib(r.children_peak_bytes)} | {_mib(r.cache_bytes)} "
            f"| {_mib(r.pages_read_bytes)} "
            f"| {_mib(s.released_bytes)} |"
        )
    return "\n".join(rows)


def run(args: argparse.Namespace) -> dict[str, Any]:
    dtype = getattr(torch, args.dtype)
    layers = layers_for(args.mib, width=args.width, vocab=args.vocab, ffn_mult=args.ffn_mult, dtype=dtype)
    shape = {"layers": layers, "width": args.width, "heads": args.heads, "vocab": args.vocab,
             "ffn_mult": args.ffn_mult, "dtype": dtype}
    work = Path(args.work)
    name = f"synthetic-l{layers}-w{args.width}-v{args.vocab}-f{args.ffn_mult}-{args.dtype}.safetensors"
    checkpoint, _ = ensure_checkpoint(SyntheticTransformer(**shape), work / name, seed=args.seed, progress=False)
    if args.cold:
        prepare_cold([checkpoint])
    tokens = torch.randint(0, args.vocab, (1, args.tokens), generator=torch.Generator().manual_seed(args.seed))

    baseline = read_status().rss_bytes
    model = SyntheticTransformer(**shape)
    map_weights(model, checkpoint, strict=True, allow_meta_buffers=True).close()
    fill_non_persistent(model)
    exported = export_mapped(model, (tokens,), checkpoint=[checkpoint])
    program = exported.program
    parts = partition_program(program, count=args.parts)
    plan = ReleasePlan.from_names(program, [p.weights for p in parts])  # mapped pages dropped, nothing resized
    steps: list[ReleaseStep] = []

    def built_one(i: int, record: EngineRecord) -> None:
        steps.append(plan.built(i))
        print(f"engine {i}: {record.compile_s:.1f} s, {_mib(record.artifact_bytes)} MiB artifact, "
              f"VmHWM {_mib(record.host_hwm_bytes)} MiB", file=sys.stderr, flush=True)

    compiler = InductorCompiler(weights=args.weights, device=args.device)
    start = time.perf_counter()
    built = build_engines(program, parts, compiler, work / f"engines-{args.weights}",
                          cache_dir=work / f"inductor-cache-{args.weights}", on_built=built_one,
                          checkpoint=[checkpoint])
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    pipeline = built.load()
    load_s = time.perf_counter() - start
    rss_loaded = read_status().rss_bytes
    reference = SyntheticTransformer(**shape)
    map_weights(reference, checkpoint, strict=True, allow_meta_buffers=True).close()
    fill_non_persistent(reference)
    comparison = compare_with_eager(pipeline, reference, (tokens,))

    records = built.records
    peak = max((r.host_hwm_bytes for r in records if r.host_hwm_bytes is not None), default=None)
    model_bytes = program_weight_bytes(program)
    result = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "torch": torch.__version__,
                    "load_average": list(os.getloadavg())},
        "model": {**{k: (str(v).removeprefix("torch.") if k == "dtype" else v) for k, v in shape.items()},
                  "bytes": model_bytes, "checkpoint": str(checkpoint)},
        "weights": args.weights,
        "device": args.device,
        "cold": args.cold,
        "baseline_rss_bytes": baseline,
        "export": exported.summary(),
        "partitions": [{"index": p.index, "weight_bytes": p.weight_bytes, "weights": len(p.weights),
                        "nodes": len(p.nodes), "inputs": list(p.inputs), "outputs": list(p.outputs)}
                       for p in parts],
        "build": {
            "seconds": round(build_s, 2),
            "baseline_rss_bytes": built.baseline_rss_bytes,
            "copy_floor_bytes": built.copy_floor_bytes,
            "peak_bytes": peak,
            "excess_over_floor_bytes": None if peak is None else peak - built.copy_floor_bytes,
            "excess_over_floor_of_model": None if peak is None else (peak - built.copy_floor_bytes) / model_bytes,
            "engines": [r.as_dict() for r in records],
            "released": [s.__dict__ for s in steps],
        },
        "load": {"seconds": round(load_s, 2), "rss_after_bytes": rss_loaded},
        "check": {"max_abs_diff": comparison.max_abs_diff, "ok": comparison.ok, "detail": comparison.detail},
        "table": table(records, steps),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.build.compile.probe", description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=float, default=200.0, help="model size in MiB (default 200)")
    parser.add_argument("--parts", type=int, default=4, help="engines to aim for (default 4)")
    parser.add_argument("--weights", choices=WEIGHTS, default="mapped")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--ffn-mult", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--tokens", type=int, default=16, help="sequence length of the example input")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cold", action="store_true", help="drop the checkpoint from the page cache first")
    parser.add_argument("--work", required=True, help="directory for the checkpoint, engines and compiler cache")
    parser.add_argument("--json", help="write the figures here as JSON")
    args = parser.parse_args(argv)
    result = run(args)
    b = result["build"]
    print(f"{result['model']['layers']} layers, {result['model']['bytes'] / MIB:.1f} MiB, weights={args.weights}; "
          f"export {result['export']['seconds']} s, read {_mib(result['export']['pages_read_bytes'])} MiB; "
          f"build {b['seconds']} s; peak {_mib(b['peak_bytes'])} MiB vs floor {_mib(b['copy_floor_bytes'])} MiB; "
          f"max abs diff {result['check']['max_abs_diff']:.3g}")
    print(result["table"])
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    if not result["check"]["ok"]:
        print(f"error: the built model differs from eager: {result['check']['detail']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
