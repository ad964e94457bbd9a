"""Host memory of `weightmap convert` under a memory cgroup smaller than the checkpoint.

Writes a float32 checkpoint of ``--gib`` GiB (tensors of ``--tensor-mib`` MiB), drops
it from the page cache, and converts it to ``--dtype`` in a child process that runs
in a fresh memory cgroup limited to ``--limit-mib`` (:func:`harness.budget.cgroup.run_in_group`:
v1 or v2, swap off in the group, the group removed afterwards). Then checks that the
output maps ``strict=True`` with no copy into a model of that dtype, and deletes both
files (``--keep`` keeps them).

Reported: whether it completed, the group's peak (``memory.max_usage_in_bytes`` on v1,
``memory.peak`` on v2: it counts the page cache charged to the group, so a conversion
that writes more than the limit shows the limit), and the child's own RSS peak
(``VmHWM``) before and during the conversion (Python and torch alone are the "before").

    python benchmarks/convert_memory.py                      # 2 GiB float32 -> bfloat16 under 512 MiB
    python benchmarks/convert_memory.py --gib 0.5 --limit-mib 384 --json

Needs root (or a delegated cgroup); without one it says why and exits with status 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from weightmap import convert_checkpoint, init_empty_weights, map_weights  # noqa: E402
from weightmap.streamwrite import TensorSpec, write_checkpoint  # noqa: E402

ROWS = 2048


def _status() -> dict[str, int]:
    """This process's VmHWM, VmRSS, RssAnon and RssFile in bytes."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                found[key] = int(value.split()[0]) * 1024
    return found


def child(source: str, destination: str, dtype: str) -> None:
    """Run in the group: convert, and print what this process held before and during it (one JSON line)."""
    before = _status()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM: the peak below is the conversion's own
        reset = True
    except OSError:
        reset = False
    started = time.perf_counter()
    convert_checkpoint(source, destination, dtype=getattr(torch, dtype))
    print(json.dumps({"before": before, "after": _status(), "hwm_reset": reset,
                      "convert_s": time.perf_counter() - started}), flush=True)


def write_source(path: Path, gib: float, tensor_mib: int) -> list[TensorSpec]:
    columns = tensor_mib * 2**20 // (4 * ROWS)
    count = max(1, round(gib * 2**30 / (ROWS * columns * 4)))
    specs = [TensorSpec(f"layers.{i}.weight", torch.float32, (ROWS, columns)) for i in range(count)]
    write_checkpoint(path, specs, lambda spec: torch.full(spec.shape, float(spec.name.split(".")[1]) / 7))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # cold: the group is charged for reading it
    finally:
        os.close(fd)
    return specs


def check_output(path: Path, specs: list[TensorSpec], dtype: torch.dtype) -> dict[str, Any]:
    """Map the output strict into a model of ``dtype``; every tensor must be a view and hold its value."""
    rows, columns = specs[0].shape
    with init_empty_weights():
        model = nn.ModuleDict({"layers": nn.ModuleList(
            nn.Linear(columns, rows, bias=False, dtype=dtype) for _ in specs)})
    mapped = map_weights(model, path, strict=True)
    first, last = model.get_parameter("layers.0.weight"), model.get_parameter(f"layers.{len(specs) - 1}.weight")
    values_ok = bool(first[0, 0] == torch.tensor(0.0, dtype=dtype)) and bool(
        last[-1, -1] == torch.tensor((len(specs) - 1) / 7, dtype=dtype))
    return {"mapped": len(mapped.mapped), "copied": len(mapped.copied), "values_ok": values_ok}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=2.0, help="size of the float32 checkpoint (default 2)")
    parser.add_argument("--tensor-mib", type=int, default=32, help="size of each float32 tensor (default 32)")
    parser.add_argument("--limit-mib", type=int, default=512, help="the memory cgroup's limit (default 512)")
    parser.add_argument("--dtype", default="bfloat16", help="what to convert to (default bfloat16)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the files (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the files")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--child", nargs=2, metavar=("SRC", "DST"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        source, destination = args.child
        child(source, destination, args.dtype)
        return 0

    from harness.budget.cgroup import run_in_group
    from harness.budget.controller import CgroupUnavailable

    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        source, destination = folder / "source-f32.safetensors", folder / f"converted-{args.dtype}.safetensors"
        started = time.perf_counter()
        specs = write_source(source, args.gib, args.tensor_mib)
        generate_s = time.perf_counter() - started
        out = folder / "child.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--dtype", args.dtype, "--child",
                   str(source), str(destination)]
        try:
            with open(out, "w") as stdout:
                attempt = run_in_group(command, args.limit_mib * 2**20, timeout_s=600, stdout=stdout,
                                       echo_stderr=not args.json, cwd=ROOT)
        except CgroupUnavailable as exc:
            print(f"no memory cgroup can be made here: {exc}", file=sys.stderr)
            return 3
        lines = out.read_text().strip().splitlines()
        measured = json.loads(lines[-1]) if attempt.completed and lines else None
        result: dict[str, Any] = {
            "source_bytes": source.stat().st_size,
            "tensors": len(specs),
            "tensor_bytes": specs[0].shape[0] * specs[0].shape[1] * 4,
            "limit_bytes": args.limit_mib * 2**20,
            "completed": attempt.completed,
            "reason": attempt.reason,
            "group_peak_bytes": attempt.group_peak_bytes,
            "oom_kills": attempt.oom_kills,
            "wall_s": attempt.wall_s,
            "generate_s": generate_s,
            "child": measured,
        }
        if attempt.completed:
            result["output_bytes"] = destination.stat().st_size
            result["check"] = check_output(destination, specs, dtype)
        if args.keep:
            kept = Path(tempfile.mkdtemp(prefix="convert-memory-", dir=args.dir))
            for path in (source, destination):
                if path.exists():
                    path.rename(kept / path.name)
            result["kept_in"] = str(kept)
    if args.json:
        print(json.dumps(result))
    else:
        mib = 2**20
        print(f"source: {result['source_bytes'] / 2**30:.2f} GiB float32, {len(specs)} tensors of "
              f"{result['tensor_bytes'] / mib:.0f} MiB; limit {args.limit_mib} MiB")
        print(f"completed: {attempt.completed} ({attempt.reason or 'exit 0'}) in {attempt.wall_s:.1f} s")
        if attempt.group_peak_bytes is not None:
            print(f"group peak (page cache included): {attempt.group_peak_bytes / mib:.0f} MiB")
        if measured:
            before, after = measured["before"], measured["after"]
            print(f"process RSS before converting (Python + torch): {before['VmRSS'] / mib:.0f} MiB; "
                  f"peak while converting (VmHWM): {after['VmHWM'] / mib:.0f} MiB, "
                  f"{(after['VmHWM'] - before['VmRSS']) / mib:.0f} MiB above; convert {measured['convert_s']:.1f} s")
        if "check" in result:
            print(f"output maps strict=True: {result['check']}")
    return 0 if attempt.completed else 1


if __name__ == "__main__":
    raise SystemExit(main())
