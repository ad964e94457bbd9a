"""What the disk does when it reads a checkpoint and writes engines at the same time, against each alone.

The question behind ``map``'s build phase on a machine whose engines are files (the ``copy``
backend without a GPU): reading the checkpoint and writing the engines share one disk, so they
overlap only as well as the disk serves both at once. A cold run measures that once, before its
first round (:mod:`harness.measure.shared_disk`), and the report counts it in the limit it sets
the build against; this script repeats the same three measurements for a closer look. Each round:

1. ``read``: the checkpoint read cold as the run's disk reference reads it (``read()`` of
   ``--chunk-mib`` MiB into a reused buffer, its pages dropped behind the reader, so that no
   page-cache growth is timed: see ``benchmarks/fresh_memory.py``);
2. ``write``: as many bytes as the checkpoint holds written into files of ``--engine-mib`` MiB under
   ``--dir``, each fsynced, dropped from the page cache and removed, as the ``copy`` backend
   writes its engines;
3. ``both``: the two at once, on two threads; the time is until both are done.

Where ``both`` is near the larger of the two alone, the disk serves reads and writes side by side;
where it is near their sum, it serves one at a time.

    python benchmarks/disk_shared.py data/pi05.safetensors
    python benchmarks/disk_shared.py data/pi05.safetensors --rounds 5 --json shared.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.measure.shared_disk import both_at_once, read_cold, write_files  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="the file to read (a checkpoint of the size in question)")
    parser.add_argument("--dir", type=Path, help="where the written files go (default: beside the checkpoint)")
    parser.add_argument("--engine-mib", type=int, default=512, help="size of each written file (default 512)")
    parser.add_argument("--chunk-mib", type=int, default=8, help="size of each read() and write() (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--json", type=Path, help="also write the seconds of every measurement here")
    args = parser.parse_args(argv)
    if not args.checkpoint.is_file():
        parser.error(f"{args.checkpoint}: no such file")
    if args.engine_mib < 1 or args.chunk_mib < 1 or args.rounds < 1:
        parser.error("--engine-mib, --chunk-mib and --rounds must be at least 1")
    directory = args.dir if args.dir is not None else args.checkpoint.parent
    if not directory.is_dir():
        parser.error(f"{directory}: no such directory")
    nbytes = args.checkpoint.stat().st_size
    chunk, engine = args.chunk_mib << 20, args.engine_mib << 20
    block = os.urandom(chunk)
    seconds: dict[str, list[float]] = {"read": [], "write": [], "both": []}
    for r in range(args.rounds):
        seconds["read"].append(read_cold([args.checkpoint], chunk))
        seconds["write"].append(write_files(directory, nbytes, engine, block))
        seconds["both"].append(both_at_once([args.checkpoint], nbytes, directory, engine, block, chunk))
        print(f"round {r + 1}/{args.rounds}: read {seconds['read'][-1]:.2f} s, write {seconds['write'][-1]:.2f} s, "
              f"both {seconds['both'][-1]:.2f} s", file=sys.stderr)
    print(f"{args.checkpoint} ({nbytes / 2**30:.2f} GiB) read cold and the same bytes written as "
          f"{args.engine_mib} MiB files, {args.rounds} rounds")
    print(f"{'measurement':<12} {'median s':>9} {'range s':>13}")
    for name, times in seconds.items():
        ordered = sorted(times)
        print(f"{name:<12} {statistics.median(ordered):>9.2f} {f'{ordered[0]:.2f}–{ordered[-1]:.2f}':>13}")
    rounds = list(zip(seconds["read"], seconds["write"], seconds["both"], strict=True))
    at_once = sorted(b / max(r, w) for r, w, b in rounds)
    one_by_one = sorted((r + w) / max(r, w) for r, w, _ in rounds)
    print(f"both / the larger alone: median {statistics.median(at_once):.2f} ({at_once[0]:.2f}–{at_once[-1]:.2f}); "
          f"1 would be reads and writes served side by side, {statistics.median(one_by_one):.2f} "
          "(the sum / the larger) one at a time")
    if args.json is not None:
        args.json.write_text(json.dumps({"checkpoint": str(args.checkpoint), "bytes": nbytes,
                                         "engine_mib": args.engine_mib, "chunk_mib": args.chunk_mib,
                                         "seconds": seconds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
