"""ReleasePlan: the safe default, tied weights dropped between readers, a repr that reads nothing."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from pages import cached_pages, drop_cache, tensor_present_pages
from safetensors.torch import save_file, save_model
from support import TinyNet, meta_tiny, returned_or_raised, seeded

from weightmap import ReleasePlan, ReleaseStep, map_weights, registry

PAGE = mmap.PAGESIZE
ROOT = Path(__file__).resolve().parents[1]


class Tied(torch.nn.Module):
    """A tied "embedding" read by the first and the last partition, and two blocks between."""

    def __init__(self, pages: int = 64) -> None:
        super().__init__()
        n = pages * PAGE // 4
        self.embed = torch.nn.Parameter(torch.empty(n, device="meta"))
        self.block0 = torch.nn.Parameter(torch.empty(n, device="meta"))
        self.block1 = torch.nn.Parameter(torch.empty(n, device="meta"))
        self.register_buffer("inv_freq", torch.arange(16, dtype=torch.float32), persistent=False)

    @staticmethod
    def partitions() -> list[list[str]]:
        return [["embed", "inv_freq"], ["block0"], ["block1"], ["embed", "inv_freq"]]


def mapped_tied(tmp_path: Path, pages: int = 64) -> tuple[Tied, Path]:
    path = tmp_path / "tied.safetensors"
    n = pages * PAGE // 4
    save_file({name: torch.full((n,), float(i + 1)) for i, name in enumerate(["embed", "block0", "block1"])},
              str(path))
    model = Tied(pages)
    map_weights(model, path, strict=True)
    return model, path


def touch(*tensors: torch.Tensor) -> None:
    for t in tensors:
        t.sum()


def test_default_plan_keeps_ordinary_buffers_so_the_model_still_runs(tmp_path: Path) -> None:
    # An ordinary non-persistent buffer (rotary frequencies) read by a partition:
    # resizing it would make the next forward a segmentation fault.
    code = """
        import sys, torch
        sys.path.insert(0, "tests")
        from safetensors.torch import save_model
        from support import TinyNet, meta_tiny, returned_or_raised, seeded
        from weightmap import ReleasePlan, map_weights
        reference = seeded(TinyNet(width=64))
        path = sys.argv[1]
        save_model(reference, path)
        model = meta_tiny(width=64)
        map_weights(model, path, strict=True)
        model.inv_freq = reference.inv_freq.clone()
        parts = model.partitions()
        parts[0].append("inv_freq")
        plan = ReleasePlan.from_names(model, parts)
        steps = [plan.built(i) for i in range(len(parts))]
        print(sum(s.kept for s in steps), model.inv_freq.untyped_storage().nbytes())
        tokens = torch.tensor([[3, 1, 4, 1, 5]])
        torch.testing.assert_close(model(tokens), reference(tokens))
        print("ran")
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tmp_path / "tiny.safetensors")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"the child died (returncode {result.returncode}): {result.stderr[-2000:]}"
    assert result.stdout.split() == ["1", str(64 * 4), "ran"]  # inv_freq kept, not resized


def test_resize_plan_frees_ordinary_storages_after_their_last_reader(tmp_path: Path) -> None:
    model, _ = mapped_tied(tmp_path, pages=4)
    inv_freq = model.inv_freq
    plan = ReleasePlan.from_names(model, Tied.partitions(), resize=True)
    first = plan.built(0)
    assert first.kept == 0 and first.dropped == 1  # the tied mapped weight; inv_freq waits for partition 3
    assert inv_freq.untyped_storage().nbytes() == 64, "an ordinary storage was resized before its last reader"
    plan.built(1)
    plan.built(2)
    last = plan.built(3)
    assert (last.released, last.kept) == (2, 0)
    assert inv_freq.untyped_storage().nbytes() == 0
    assert model.embed.untyped_storage().nbytes() == 4 * PAGE  # mapped: never resized


def test_tied_mapped_weight_is_dropped_after_every_reader(tmp_path: Path) -> None:
    model, path = mapped_tied(tmp_path)
    weight = 64 * PAGE
    plan = ReleasePlan.from_names(model, Tied.partitions())
    assert plan.pending_bytes == 3 * weight + 64

    touch(model.embed)
    assert tensor_present_pages(model.embed) >= 64
    step = plan.built(0)
    assert (step.dropped, step.dropped_bytes) == (1, weight)
    assert (step.released, step.released_bytes) == (0, 0)
    assert step.kept == 0, "inv_freq's last reader is partition 3"
    assert tensor_present_pages(model.embed) <= 2, "the tied weight stayed resident after its first reader"

    for i, name in ((1, "block0"), (2, "block1")):
        touch(getattr(model, name))
        step = plan.built(i)
        assert (step.released, step.released_bytes, step.dropped) == (1, weight, 0)
        assert tensor_present_pages(getattr(model, name)) <= 2
        # Not asserted: that embed stays out of the process meanwhile. The plan never touches
        # it, but reading a neighbour can map its pages back from the page cache: Linux maps a
        # whole large page-cache folio on a fault, and one folio can hold the end of block1 and
        # most of embed (see test_a_neighbours_read_can_map_dropped_pages_back_from_the_cache).

    assert float(model.embed.detach()[0]) == 1.0  # re-read from the file
    touch(model.embed)
    step = plan.built(3)
    assert (step.released, step.released_bytes, step.dropped) == (1, weight, 0)
    assert (step.kept, step.kept_bytes) == (1, 64)  # inv_freq: ordinary, kept without resize=True
    assert tensor_present_pages(model.embed) <= 2
    assert plan.pending_bytes == 0


def test_a_neighbours_read_can_map_dropped_pages_back_from_the_cache(tmp_path: Path) -> None:
    # Why the test above does not assert that embed stays out between its readers. Under memory
    # pressure the kernel reclaims the page that block1 and embed share (kept mapped by the drop,
    # which rounds inward); block1's next read of it faults, and the fault maps every page of the
    # page-cache folio around it: embed's dropped pages come back into the process (no I/O).
    # The next release of embed drops them again.
    model, path = mapped_tied(tmp_path)
    plan = ReleasePlan.from_names(model, Tied.partitions())
    touch(model.embed)
    assert plan.built(0).dropped == 1
    assert tensor_present_pages(model.embed) <= 2
    (region,) = [r for r in registry.live_regions() if r.path == path]
    mapping = region.ref()
    assert mapping is not None
    mapping.madvise(mmap.MADV_DONTNEED)  # what reclaim does to the pages still mapped, the shared ones too
    plan.built(1)
    touch(model.block1)
    back = tensor_present_pages(model.embed)  # 0 where faults map one page, 64 here (Linux 6.18, large folios)
    plan.built(2)
    step = plan.built(3)
    assert (step.released, step.released_bytes) == (1, 64 * PAGE)
    assert tensor_present_pages(model.embed) <= 2, f"embed's {back} pages mapped back were not dropped again"


def test_reread_false_keeps_a_tied_weight_and_its_writes_until_its_last_reader(tmp_path: Path) -> None:
    model, _ = mapped_tied(tmp_path)
    plan = ReleasePlan.from_names(model, Tied.partitions(), reread=False)
    with torch.no_grad():
        model.embed.fill_(7.0)  # written in place by the first partition
    step = plan.built(0)
    assert (step.dropped, step.dropped_bytes, step.released) == (0, 0, 0)
    assert tensor_present_pages(model.embed) >= 64, "the tied weight was dropped before its last reader"
    plan.built(1)
    plan.built(2)
    assert bool((model.embed == 7.0).all()), "the in-place write was lost before the last reader"
    step = plan.built(3)
    assert (step.released, step.released_bytes) == (1, 64 * PAGE)
    assert float(model.embed.detach()[PAGE]) == 1.0  # after its last reader it reverts to the file


def test_reread_drops_discard_in_place_writes(tmp_path: Path) -> None:
    model, _ = mapped_tied(tmp_path)
    plan = ReleasePlan.from_names(model, Tied.partitions())
    with torch.no_grad():
        model.embed.fill_(7.0)
    plan.built(0)
    # Whole pages re-read from the file; the partial pages at the ends keep the write.
    assert int((model.embed == 1.0).sum()) >= model.embed.numel() - 2 * PAGE // 4


def test_every_storage_is_released_once_whatever_reread_does(tmp_path: Path) -> None:
    reference = seeded(TinyNet(width=256))
    path = tmp_path / "tiny.safetensors"
    save_model(reference, str(path))
    for reread in (True, False):
        model = meta_tiny(width=256)
        map_weights(model, path, strict=True)
        plan = ReleasePlan.from_names(model, model.partitions(), reread=reread)
        total = plan.pending_bytes
        steps = [plan.built(i) for i in range(4)]
        assert sum(s.released_bytes for s in steps) == total
        assert sum(s.kept for s in steps) == 0
        tied = model.embed.weight.untyped_storage().nbytes()
        assert sum(s.dropped_bytes for s in steps) == (tied if reread else 0)


def test_repr_is_short_and_reads_no_weight(tmp_path: Path) -> None:
    model, _ = mapped_tied(tmp_path)  # three 256 KiB weights
    plan = ReleasePlan.from_names(model, Tied.partitions())
    text = repr(plan)
    assert len(text) < 300, text
    assert text.startswith("ReleasePlan(partitions=4, next=0, storages=4,")
    assert sum(tensor_present_pages(t) for t in (model.embed, model.block0, model.block1)) == 0, \
        "repr() read weight pages"
    touch(model.embed)
    step = plan.built(0)
    assert tensor_present_pages(model.embed) <= 2
    assert len(repr(plan)) < 300 and "next=1" in repr(plan)
    assert tensor_present_pages(model.embed) <= 2, "repr() faulted released pages back in"
    assert repr(step) == "ReleaseStep(index=0, released=0, released_bytes=0, kept=0, kept_bytes=0, " \
                         f"dropped=1, dropped_bytes={model.embed.untyped_storage().nbytes()})"
    assert isinstance(step, ReleaseStep)


def storage_file_range(model: Tied, name: str, path: Path) -> tuple[int, int]:
    """Where a mapped parameter's bytes lie in its file: (offset, length)."""
    from weightmap.prefetch import file_ranges

    (r,) = file_ranges([getattr(model, name)])
    assert r.path == path
    return r.offset, r.length


def test_built_after_close_still_releases_and_drops_the_cache(tmp_path: Path) -> None:
    model, path = mapped_tied(tmp_path)
    drop_cache(path)  # written back: the kernel never evicts dirty pages
    plan = ReleasePlan.from_names(model, Tied.partitions(), prefetch="madvise", drop_cache=True)
    plan.prefetch(0)
    plan.close()
    touch(model.embed)
    step = plan.built(0)  # raised "this Prefetcher is closed" before
    assert (step.index, step.dropped) == (0, 1)
    assert tensor_present_pages(model.embed) <= 2
    touch(model.block0)
    offset, length = storage_file_range(model, "block0", path)
    assert cached_pages(path, offset, length) >= 64
    step = plan.built(1)
    assert (step.index, step.released, step.released_bytes) == (1, 1, 64 * PAGE)
    assert tensor_present_pages(model.block0) <= 2
    assert cached_pages(path, offset, length) <= 2, "drop_cache did nothing after close()"
    assert [plan.built(i).index for i in (2, 3)] == [2, 3]
    assert plan.pending_bytes == 0


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
@pytest.mark.parametrize("method", ["read", "fadvise"])
def test_a_checkpoint_replaced_by_a_fifo_never_blocks_prefetch_or_close(tmp_path: Path, method: str) -> None:
    model, path = mapped_tied(tmp_path)
    plan = ReleasePlan.from_names(model, Tied.partitions(), prefetch=method)  # type: ignore[arg-type]
    os.remove(path)
    os.mkfifo(path)
    plan.prefetch(0)
    plan.wait_for_prefetch(10)  # the thread has tried the path (before the fix: stuck opening it)
    returned_or_raised(plan.close, path, f"close() of a {method!r} prefetch")
    stats = plan.prefetch_stats
    assert stats is not None and stats.errors >= 1 and stats.warmed_bytes == 0
    assert float(model.embed.detach()[0]) == 1.0  # the mapping itself still reads the file it mapped


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_drop_cache_never_blocks_on_a_checkpoint_replaced_by_a_fifo(tmp_path: Path) -> None:
    model, path = mapped_tied(tmp_path)
    plan = ReleasePlan.from_names(model, Tied.partitions(), drop_cache=True)
    os.remove(path)
    os.mkfifo(path)
    steps: list[ReleaseStep] = []
    returned_or_raised(lambda: steps.extend(plan.built(i) for i in range(4)), path, "built() evicting")
    assert [s.index for s in steps] == [0, 1, 2, 3]
    assert (sum(s.released for s in steps), sum(s.kept for s in steps)) == (3, 1)  # inv_freq is kept
