"""Threads mapping and releasing at once: every mapped storage stays releasable, none is lost.

A mapping freed on one thread is unmapped before its weak-reference callback
runs; another thread can map a new file at the same address in between. A
registry that forgot "the region at this address" in that callback deleted the
new mapping's entry and kept the dead one, and from then on storages at that
address were not recognised as mapped: their release was lost.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from weightmap import map_weights, release_mapped_storage

THREADS = 8
NAMES = ("a", "b", "c", "d")
PAGES = 4  # every file the same size, so freed addresses are reused by the next mapping
SECONDS = float(os.environ.get("WEIGHTMAP_STRESS_SECONDS", "20"))


class Buffers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        for name in NAMES:
            self.register_buffer(name, torch.empty(PAGES * mmap.PAGESIZE, dtype=torch.uint8, device="meta"))


def map_and_release(path: Path, deadline: float, counts: list[int], errors: list[BaseException]) -> None:
    expected = released = 0
    try:
        while time.monotonic() < deadline:
            model = Buffers()
            mapped = map_weights(model, path, strict=True)
            mapped.close()
            for name in NAMES:
                expected += 1
                released += release_mapped_storage(getattr(model, name))
            del model, mapped  # the last views go: the mapping is unmapped here, on this thread
    except BaseException as exc:  # noqa: B036 - reported by the test thread
        errors.append(exc)
    counts.extend((expected, released))


@pytest.mark.stress
def test_threads_mapping_and_releasing_lose_no_release(tmp_path: Path) -> None:
    paths = []
    for i in range(THREADS):
        path = tmp_path / f"m{i}.safetensors"
        save_file({name: torch.full((PAGES * mmap.PAGESIZE,), i, dtype=torch.uint8) for name in NAMES}, str(path))
        paths.append(path)
    deadline = time.monotonic() + SECONDS
    counts: list[list[int]] = [[] for _ in paths]
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=map_and_release, args=(path, deadline, count, errors))
        for path, count in zip(paths, counts, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    expected = sum(count[0] for count in counts)
    released = sum(count[1] for count in counts)
    print(f"{THREADS} threads, {SECONDS:g} s: {released} of {expected} storages released")
    assert expected > 0
    assert released == expected, f"{expected - released} of {expected} releases lost"
