"""Does prefetching the next partition overlap disk reads with the build, and at what memory cost?

Writes a checkpoint of ``--gib`` GiB (under ``--dir``, default the system's
temporary directory; never the repository's ``data/``), then builds it
partition by partition in a fresh process per run, cold cache each time:

* a partition's "build" copies each of its mapped tensors into one reused
  buffer (every page is read through the mapping) and then does ``--cpu-ms``
  of CPU work, standing in for an engine compile;
* after each build the partition is reported to a :class:`weightmap.ReleasePlan`,
  which drops its pages;
* a prefetch variant ``METHOD:AHEAD`` makes the plan warm the page cache with
  one of :data:`weightmap.PREFETCH_METHODS` (``ReleasePlan(prefetch=METHOD,
  prefetch_ahead=AHEAD)``): ``AHEAD=1`` warms the partition after the one
  being built (double buffering), ``AHEAD=0`` only the one being built;
* an ``evict`` variant (``METHOD:AHEAD:evict``, or ``none:evict``) makes the
  plan drop each released weight from the page cache too
  (``ReleasePlan(drop_cache=True)``);
* ``METHOD:AHEAD:rN`` warms with ``N`` reader threads asking at once
  (``prefetch_readers=N``), each request ``--request-mib`` MiB.

Cold means: the file is fsynced (dirty pages are never dropped) and its pages
evicted with ``POSIX_FADV_DONTNEED``; the residency at the start of each run is
recorded (mincore) so a run that did not start cold shows. A cold sequential
``pread`` of the whole file is measured in the same way, as the disk's
reference bandwidth.

Variants run interleaved, ``--repeats`` times each, and the table shows
medians (the machine may be shared: compare variants of one run, not runs).
Per run: the build's wall time, the time spent copying (waiting for pages)
and the CPU work, VmHWM, the largest RssFile and RssAnon seen, and the page
cache the file held at the end.

    python benchmarks/prefetch.py --gib 2
    python benchmarks/prefetch.py --gib 2 --variants none,fadvise:0,fadvise:1 --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout: this weightmap, not an installed one

import torch  # noqa: E402

from harness.measure.coldcache import write_back_and_drop  # noqa: E402
from harness.measure.residency import FileResidency  # noqa: E402
from weightmap import PREFETCH_METHODS, ReleasePlan, map_weights  # noqa: E402
from weightmap.format import read_header  # noqa: E402
from weightmap.prefetch import CHUNK_BYTES, PrefetchMethod  # noqa: E402
from weightmap.streamwrite import TensorSpec, write_checkpoint  # noqa: E402

TENSOR_BYTES = 64 * 2**20

# ----------------------------------------------------------------------------- /proc and the page cache


def status() -> dict[str, int]:
    """VmHWM, VmRSS, RssAnon and RssFile of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def cached_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache (the harness's residency reader: cachestat or mincore)."""
    with FileResidency([path]) as residency:
        return residency.resident_bytes()


def make_cold(path: Path) -> int:
    """Write the file back, then evict its pages; returns the bytes still cached afterwards."""
    write_back_and_drop(path)
    return cached_bytes(path)


# ----------------------------------------------------------------------------- the checkpoint


def names(count: int) -> list[str]:
    return [f"t{i:04d}" for i in range(count)]


def write(path: Path, gib: float) -> int:
    count = max(1, round(gib * 2**30 / TENSOR_BYTES))
    gen = torch.Generator().manual_seed(0)
    specs = [TensorSpec(n, torch.uint8, (TENSOR_BYTES,)) for n in names(count)]
    write_checkpoint(path, specs, lambda spec: torch.randint(0, 256, spec.shape, dtype=torch.uint8, generator=gen))
    return count


class Weights(torch.nn.Module):
    def __init__(self, count: int) -> None:
        super().__init__()
        for n in names(count):
            self.register_buffer(n, torch.empty(TENSOR_BYTES, dtype=torch.uint8, device="meta"))


# ----------------------------------------------------------------------------- one run (child process)


@dataclass
class Variant:
    method: str  # "none" or one of PREFETCH_METHODS
    ahead: int = 0
    evict: bool = False
    readers: int = 1

    @classmethod
    def parse(cls, text: str) -> Variant:
        method, *rest = text.split(":")
        if method != "none" and method not in PREFETCH_METHODS:
            raise SystemExit(f"unknown variant {text!r}: method must be none or one of {PREFETCH_METHODS}")
        evict = "evict" in rest
        numbers = [int(p) for p in rest if p.isdigit()]
        readers = [int(p[1:]) for p in rest if p[:1] == "r" and p[1:].isdigit()]
        if len(numbers) + evict + len(readers) != len(rest) or len(readers) > 1:
            raise SystemExit(f"unknown variant {text!r}: expected METHOD[:AHEAD][:rREADERS][:evict]")
        return cls(method, numbers[0] if numbers else 1, evict, readers[0] if readers else 1)

    @property
    def label(self) -> str:
        base = "none" if self.method == "none" else f"{self.method}:{self.ahead}"
        return base + (f":r{self.readers}" if self.readers != 1 else "") + (":evict" if self.evict else "")


def cpu_work(seconds: float, a: torch.Tensor) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        torch.mm(a, a)


def run_once(path: Path, count: int, partitions: int, variant: Variant, cpu_ms: float,
             request_bytes: int = CHUNK_BYTES) -> dict[str, Any]:
    torch.set_num_threads(1)  # one core builds; the other is left to the kernel and the prefetch thread
    cold = make_cold(path)
    model = Weights(count)
    map_weights(model, path, strict=True).close()
    all_names = names(count)
    per = -(-count // partitions)
    parts = [all_names[i : i + per] for i in range(0, count, per)]
    tensors = [[getattr(model, n) for n in part] for part in parts]
    method = None if variant.method == "none" else cast(PrefetchMethod, variant.method)
    plan = ReleasePlan.from_names(model, parts, prefetch=method, prefetch_ahead=variant.ahead,
                                  drop_cache=variant.evict, prefetch_readers=variant.readers,
                                  prefetch_request_bytes=request_bytes)
    buffer = torch.empty(TENSOR_BYTES, dtype=torch.uint8)
    buffer.fill_(0)  # its pages are ours before the peak is reset
    work = torch.randn(256, 256)
    peak_supported = reset_peak()
    rss_file = rss_anon = 0
    times, copies = [], []
    start = time.perf_counter()
    if variant.method != "none":
        plan.prefetch(0)
    for i, part in enumerate(tensors):
        t0 = time.perf_counter()
        for t in part:
            buffer.copy_(t)
        t1 = time.perf_counter()
        cpu_work(cpu_ms / 1000, work)
        st = status()
        rss_file, rss_anon = max(rss_file, st["RssFile"]), max(rss_anon, st["RssAnon"])
        plan.built(i)
        times.append(time.perf_counter() - t0)
        copies.append(t1 - t0)
    total = time.perf_counter() - start
    st = status()
    stats = plan.prefetch_stats
    plan.close()
    return {
        "variant": variant.label, "total_s": total, "partition_s": times, "copy_s": copies,
        "hwm_bytes": st["VmHWM"] if peak_supported else None, "max_rss_file_bytes": rss_file,
        "max_rss_anon_bytes": rss_anon, "cached_at_start_bytes": cold, "cached_at_end_bytes": cached_bytes(path),
        "prefetch": asdict(stats) if stats is not None else None,
    }


def read_once(path: Path, chunk: int = 8 * 2**20) -> dict[str, Any]:
    """Cold sequential pread of the whole file: the disk's reference bandwidth."""
    cold = make_cold(path)
    buf = bytearray(chunk)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    start = time.perf_counter()
    done = 0
    try:
        while n := os.preadv(fd, [view], done):
            done += n
    finally:
        os.close(fd)
    seconds = time.perf_counter() - start
    return {"variant": "cold read", "total_s": seconds, "bytes": done, "cached_at_start_bytes": cold}


# ----------------------------------------------------------------------------- the parent


def child(args: argparse.Namespace, variant: str | None) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", variant or "read", "--file", str(args.file),
               "--partitions", str(args.partitions), "--cpu-ms", str(args.cpu_ms),
               "--request-mib", str(args.request_mib)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"run {variant or 'read'} failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"


def table(results: list[dict[str, Any]], size: int, partitions: int) -> str:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by.setdefault(str(r["variant"]), []).append(r)
    reads = by.pop("cold read", [])
    lines = []
    if reads:
        secs = statistics.median(float(r["total_s"]) for r in reads)
        lines.append(f"cold sequential read: {size / secs / 1e6:,.0f} MB/s (median of {len(reads)}, "
                     f"{secs:.2f} s for {size / 2**30:.2f} GiB)\n")
    lines.append("| variant | runs | total s (min-max) | per partition s | copy s (waiting for pages) | "
                 "VmHWM MiB | max RssFile MiB | max RssAnon MiB | cached at start MiB | cached at end MiB |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    base = None
    for label, runs in by.items():
        totals = [float(r["total_s"]) for r in runs]
        per = statistics.median(statistics.median(r["partition_s"]) for r in runs)
        copy = statistics.median(sum(r["copy_s"]) for r in runs)
        med = statistics.median(totals)
        base = med if base is None else base
        med_of = {k: statistics.median(int(r[k]) for r in runs if r[k] is not None)
                  if any(r[k] is not None for r in runs) else None
                  for k in ("hwm_bytes", "max_rss_file_bytes", "max_rss_anon_bytes", "cached_at_start_bytes",
                            "cached_at_end_bytes")}
        lines.append(
            f"| {label} | {len(runs)} | {med:.2f} ({min(totals):.2f}-{max(totals):.2f}), {med / base:.2f}x | "
            f"{per:.3f} | {copy:.2f} | {mib(med_of['hwm_bytes'])} | "
            f"{mib(med_of['max_rss_file_bytes'])} | {mib(med_of['max_rss_anon_bytes'])} | "
            f"{mib(med_of['cached_at_start_bytes'])} | "
            f"{mib(med_of['cached_at_end_bytes'])} |"
        )
    lines.append(f"\n{partitions} partitions; ratios against the first variant.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="checkpoint size (default 2)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the checkpoint is written (default: the system's temporary directory)")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--cpu-ms", type=float, default=250.0, help="CPU work per partition (default 250)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default="none,none:evict,fadvise:0,fadvise:1,madvise:1,madvise:1:evict,read:1",
                        help="comma-separated METHOD[:AHEAD[:evict]], METHOD none or one of "
                             + ", ".join(PREFETCH_METHODS))
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint afterwards")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument("--request-mib", type=float, default=CHUNK_BYTES / 2**20,
                        help="bytes of each prefetch request, in MiB (default weightmap's)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        n = len(read_header(args.file).tensors)
        if args.child == "read":
            result = read_once(args.file)
        else:
            result = run_once(args.file, n, args.partitions, Variant.parse(args.child), args.cpu_ms,
                              int(args.request_mib * 2**20))
        print(json.dumps(result))
        return 0

    variants = [Variant.parse(v) for v in args.variants.split(",") if v]
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / f"weightmap-prefetch-{args.gib:g}gib.safetensors"
    if not path.exists():
        print(f"writing {path} ...", file=sys.stderr)
        write(path, args.gib)
    args.file = path
    size = path.stat().st_size
    results: list[dict[str, Any]] = []
    try:
        for repeat in range(args.repeats):
            results.append(child(args, None))
            for v in variants:
                r = child(args, v.label)
                results.append(r)
                print(f"[{repeat + 1}/{args.repeats}] {v.label}: {float(r['total_s']):.2f} s", file=sys.stderr)
    finally:
        if not args.keep:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    if args.json:
        args.json.write_text(json.dumps({"size_bytes": size, "cpu_ms": args.cpu_ms, "partitions": args.partitions,
                                         "runs": results}, indent=1))
    print(table(results, size, args.partitions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
