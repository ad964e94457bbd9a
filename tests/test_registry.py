"""The registry of mappings: entries are removed by identity, and a dead entry is never returned or in the way.

The interleavings are made deterministic here by registering entries for
anonymous mappings at made-up addresses (low addresses no real mapping has);
``test_registry_stress.py`` runs the real thing on threads.
"""

from __future__ import annotations

import gc
import mmap
import os
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from weightmap import registry

PAGE = mmap.PAGESIZE
BASE = 16 * PAGE  # no real mapping starts this low


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    yield
    with registry._lock:
        for i in reversed(range(len(registry._regions))):
            if registry._bases[i] < 1024 * PAGE:
                registry._delete(i)


def register(base: int, length: int, mm: mmap.mmap, *, callback: bool = True) -> weakref.ReferenceType[mmap.mmap]:
    """An entry for ``mm`` as if it were mapped at ``base``; without ``callback``, its death is only seen later."""
    ref = weakref.ref(mm, registry._on_unmapped) if callback else weakref.ref(mm)
    with registry._lock:
        registry._register(registry.Region(base, length, Path(f"/fake/{base}"), ref))
    return ref


def entries_at_fake_addresses() -> list[registry.Region]:
    with registry._lock:
        return [r for r in registry._regions if r.base < 1024 * PAGE]


def test_a_late_callback_removes_only_its_own_entry() -> None:
    """A's mapping dies; B is mapped at A's address before A's callback runs; then the callback runs."""
    old = mmap.mmap(-1, PAGE)
    old_ref = register(BASE, PAGE, old, callback=False)  # its callback has not run yet
    del old
    new = mmap.mmap(-1, PAGE)
    register(BASE, PAGE, new)
    registry._on_unmapped(old_ref)  # the late callback

    found = registry.find_region(BASE, PAGE)
    assert found is not None and found[1] is new
    assert [r.ref() for r in entries_at_fake_addresses()] == [new]


def test_a_dead_entry_never_shadows_a_live_mapping() -> None:
    """A dead entry for a long range, and a new mapping that starts below it and overlaps it."""
    old = mmap.mmap(-1, PAGE)
    register(BASE + 4 * PAGE, 64 * PAGE, old, callback=False)
    del old
    new = mmap.mmap(-1, PAGE)
    register(BASE, 8 * PAGE, new)
    assert [r.ref() for r in entries_at_fake_addresses()] == [new]  # the dead one it overlaps is gone

    found = registry.find_region(BASE + 6 * PAGE, PAGE)  # inside both ranges: only the live one counts
    assert found is not None and found[1] is new
    assert registry.find_region(BASE + 20 * PAGE, PAGE) is None  # only the dead one covered this
    assert [r.ref() for r in entries_at_fake_addresses()] == [new]


def test_a_lookup_removes_the_dead_entry_it_meets_and_looks_further() -> None:
    below = mmap.mmap(-1, PAGE)
    register(BASE, 2 * PAGE, below)
    dead = mmap.mmap(-1, PAGE)
    register(BASE + 8 * PAGE, PAGE, dead, callback=False)
    del dead

    assert registry.find_region(BASE + 8 * PAGE, 16) is None
    assert [r.ref() for r in entries_at_fake_addresses()] == [below]
    found = registry.find_region(BASE + PAGE, 16)
    assert found is not None and found[1] is below


def test_callbacks_remove_entries_and_live_regions_lists_only_live_ones() -> None:
    maps = [mmap.mmap(-1, PAGE) for _ in range(3)]
    for i, mm in enumerate(maps):
        register(BASE + 4 * i * PAGE, PAGE, mm)
    del maps[1]
    assert [r.base for r in registry.live_regions() if r.base < 1024 * PAGE] == [BASE, BASE + 8 * PAGE]
    assert len(entries_at_fake_addresses()) == 2  # removed, not just hidden


def test_a_closed_mapping_is_not_ours_any_more(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.ones(4 * PAGE, dtype=torch.uint8)}, str(path))
    fd = os.open(path, os.O_RDONLY)
    try:
        mm = registry.map_descriptor(fd, path.stat().st_size, path)
    finally:
        os.close(fd)
    region = next(r for r in registry.live_regions() if r.path == path)
    assert registry.find_region(region.base + PAGE, PAGE) is not None
    mm.close()  # its memory is gone, and the next mapping may get its address
    assert registry.find_region(region.base + PAGE, PAGE) is None
    del mm
    gc.collect()
    assert not [r for r in registry.live_regions() if r.path == path]
