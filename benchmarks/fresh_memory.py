"""What memory the kernel has not just freed costs on this machine, against memory it freed a moment before.

The question behind ``drop_cache`` (:mod:`harness.checkpoint_reading`): on a virtual machine whose kernel reports
its free pages to the host (:func:`harness.measure.hostmemory.free_page_reporting`), memory left unused
for a few seconds must be backed by the host again before it is written. Each round:

1. waits ``--quiet-s`` seconds (Linux reports free pages 2 s after they were freed);
2. ``fresh``: maps ``--mib`` MiB of anonymous memory with ``MAP_POPULATE`` (the kernel zeroes every
   page: each is written once) and times it, then unmaps it;
3. ``recycled``: maps and populates the same size again at once, on the pages just freed;
4. ``write fresh`` / ``write recycled``: the same two ways for ``write()`` of ``--mib`` MiB into a new
   file under ``--dir`` (page cache the CPU fills, as an engine file's), fsynced and dropped after.

The kernel hands out the pages it has not reported first, so a round right after a large free (a
cold-cache drop of GiBs, say) may find no reported page within ``--mib``: read ``fresh`` as the
rate memory costs once those are used up, and repeat with a longer quiet where rounds disagree.

    python benchmarks/fresh_memory.py
    python benchmarks/fresh_memory.py --mib 1024 --rounds 5 --json fresh.json
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.measure.hostmemory import free_page_reporting  # noqa: E402

CHUNK = 8 << 20


def _populate(nbytes: int) -> float:
    """Seconds to map and populate ``nbytes`` of anonymous memory; the memory is unmapped after."""
    started = time.perf_counter()
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
    seconds = time.perf_counter() - started
    region.close()
    return seconds


def _write(directory: Path, nbytes: int, block: bytes) -> float:
    """Seconds to ``write()`` ``nbytes`` into a new file (page cache filled by the CPU); the file is gone after."""
    fd, name = tempfile.mkstemp(dir=directory, prefix="fresh-memory-")
    try:
        started = time.perf_counter()
        for _ in range(nbytes // len(block)):
            os.write(fd, block)
        seconds = time.perf_counter() - started
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return seconds
    finally:
        os.close(fd)
        os.unlink(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512, help="size of each measurement (default 512)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--quiet-s", type=float, default=4.0, help="wait before each round's fresh figures (4)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the files go")
    parser.add_argument("--json", type=Path, help="also write the seconds of every measurement here")
    args = parser.parse_args(argv)
    if args.mib < 8 or args.rounds < 1 or args.quiet_s < 0:
        parser.error("--mib at least 8, --rounds at least 1, --quiet-s not negative")
    nbytes = args.mib << 20
    block = os.urandom(CHUNK)
    seconds: dict[str, list[float]] = {"fresh": [], "recycled": [], "write fresh": [], "write recycled": []}
    for r in range(args.rounds):
        time.sleep(args.quiet_s)
        seconds["fresh"].append(_populate(nbytes))
        seconds["recycled"].append(_populate(nbytes))
        time.sleep(args.quiet_s)
        seconds["write fresh"].append(_write(args.dir, nbytes, block))
        seconds["write recycled"].append(_write(args.dir, nbytes, block))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    reporting = free_page_reporting()
    print(f"free page reporting: {reporting or 'none found'}; {args.mib} MiB each, {args.rounds} rounds, "
          f"{args.quiet_s:g} s quiet before the fresh figures")
    print(f"{'measurement':<16} {'median GB/s':>12} {'range GB/s':>16}")
    for name, times in seconds.items():
        rates = sorted(nbytes / s / 1e9 for s in times)
        print(f"{name:<16} {statistics.median(rates):>12.2f} {f'{rates[0]:.2f}–{rates[-1]:.2f}':>16}")
    if args.json is not None:
        args.json.write_text(json.dumps({"mib": args.mib, "quiet_s": args.quiet_s, "reporting": reporting,
                                         "seconds": seconds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
