"""Releasing mapped weights: pages dropped, tensors still valid, neighbours and files untouched."""

from __future__ import annotations

import gc
import mmap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file, save_model
from support import TinyNet, mapped_ranges, meta_tiny, seeded, sha256, smaps_rss

import weightmap.release
from weightmap import MappingError, ReleasePlan, map_weights, release_mapped_storage, release_storage

PAGE = mmap.PAGESIZE


class Buffers(torch.nn.Module):
    """Buffers sized in pages, laid out one after the other in the file."""

    def __init__(self, names: list[str], pages: int, device: str = "meta") -> None:
        super().__init__()
        for name in names:
            self.register_buffer(name, torch.empty(pages * PAGE, dtype=torch.uint8, device=device))


def write_buffers(path: Path, names: list[str], pages: int) -> dict[str, torch.Tensor]:
    values = {name: torch.full((pages * PAGE,), i + 1, dtype=torch.uint8) for i, name in enumerate(names)}
    save_file(values, str(path))
    return values


def test_release_storage_drops_mapped_pages_without_resizing(tmp_path: Path) -> None:
    path = tmp_path / "b.safetensors"
    write_buffers(path, ["a"], pages=64)
    model = Buffers(["a"], pages=64)
    map_weights(model, path)
    assert int(model.a.sum()) == 64 * PAGE  # fault every page in
    resident = smaps_rss(path)
    assert resident >= 60 * PAGE
    assert release_storage(model.a) is True
    assert model.a.untyped_storage().nbytes() == 64 * PAGE  # not resized
    assert smaps_rss(path) <= resident - 60 * PAGE
    assert int(model.a.sum()) == 64 * PAGE  # re-read from the file


def test_release_storage_resizes_an_ordinary_storage_when_asked() -> None:
    t = torch.ones(1024)
    assert release_mapped_storage(t) is False
    assert release_storage(t) is False  # the default keeps ordinary storages
    assert t.untyped_storage().nbytes() == 4096
    assert release_storage(t, resize=True) is True
    assert t.untyped_storage().nbytes() == 0


def test_release_storage_leaves_foreign_unresizable_storages_alone(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "f.safetensors"
    save_file({"w": torch.ones(4096)}, str(path))
    foreign = load_file(str(path))["w"]  # safetensors' own mapping: not resizable
    buffer = bytearray(b"\1" * 64)
    view = torch.frombuffer(buffer, dtype=torch.uint8)
    with caplog.at_level("DEBUG", logger="weightmap"):
        assert release_storage(view, resize=True) is False
        assert release_storage(foreign, resize=True) in (False, True)  # resizable in some safetensors versions
    assert view.untyped_storage().nbytes() == 64 and int(view.sum()) == 64
    assert "not resizable" in caplog.text


def test_release_keeps_neighbours_in_place_writes(tmp_path: Path) -> None:
    # Three buffers of 2.5 pages each: every boundary falls inside a page, so
    # releasing the middle one must round inward or lose a neighbour's writes.
    path = tmp_path / "n.safetensors"
    size = PAGE * 5 // 2
    values = {n: torch.full((size,), i + 1, dtype=torch.uint8) for i, n in enumerate(["a", "b", "c"])}
    save_file(values, str(path))

    class Three(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for n in ("a", "b", "c"):
                self.register_buffer(n, torch.empty(size, dtype=torch.uint8, device="meta"))

    model = Three()
    map_weights(model, path)
    model.a.fill_(101)
    model.b.fill_(102)
    model.c.fill_(103)
    assert release_mapped_storage(model.b) is True
    assert bool((model.a == 101).all()), "a neighbour's in-place write was lost"
    assert bool((model.c == 103).all()), "a neighbour's in-place write was lost"
    # The released buffer's whole pages were re-read from the file; at most the
    # partial pages it shares with its neighbours keep its write.
    reverted = int((model.b == 2).sum())
    assert reverted >= size - 2 * PAGE
    assert reverted > 0


def test_release_with_page_sized_buffers_reverts_whole_buffer(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    header_padding_safe = ["a", "b"]
    write_buffers(path, header_padding_safe, pages=4)
    model = Buffers(header_padding_safe, pages=4)
    map_weights(model, path)
    model.a.fill_(9)
    release_mapped_storage(model.a)
    # Data starts after the header, so at most one page at each end stays private.
    assert int((model.a == 1).sum()) >= 2 * PAGE


def test_other_storages_are_not_touched() -> None:
    t = torch.arange(PAGE * 4, dtype=torch.uint8)
    before = t.clone()
    assert release_mapped_storage(t) is False
    assert torch.equal(t, before)
    assert release_mapped_storage(t.untyped_storage()) is False


def test_closed_handle_does_not_stop_release(tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    write_buffers(path, ["a"], pages=32)
    model = Buffers(["a"], pages=32)
    with map_weights(model, path) as mapped:
        pass
    assert mapped.closed
    model.a.sum()
    resident = smaps_rss(path)
    assert release_mapped_storage(model.a) is True
    assert smaps_rss(path) < resident


def test_mapping_is_freed_with_its_views(tmp_path: Path) -> None:
    path = tmp_path / "v.safetensors"
    write_buffers(path, ["a", "b"], pages=2)
    model = Buffers(["a", "b"], pages=2)
    mapped = map_weights(model, path)
    mapped.close()
    assert mapped_ranges(path), "views must keep the mapping alive after close()"
    a = model.a
    del model
    gc.collect()
    assert mapped_ranges(path), "one live view keeps the mapping"
    assert int(a[0]) == 1
    del a
    gc.collect()
    assert mapped_ranges(path) == [], "the mapping outlived its last view"


def test_unclosed_handle_keeps_mapping_until_dropped(tmp_path: Path) -> None:
    path = tmp_path / "h.safetensors"
    write_buffers(path, ["a"], pages=2)
    model = Buffers(["a"], pages=2)
    mapped = map_weights(model, path)
    del model
    gc.collect()
    assert mapped_ranges(path)
    del mapped
    gc.collect()
    assert mapped_ranges(path) == []


def test_file_is_never_written(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    write_buffers(path, ["a", "b"], pages=8)
    digest = sha256(path)
    model = Buffers(["a", "b"], pages=8)
    map_weights(model, path)
    model.a.fill_(200)
    model.b.add_(3)
    release_storage(model.a)
    model.b.mul_(2)
    del model
    gc.collect()
    assert sha256(path) == digest


def test_partitioned_build_releases_after_last_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = seeded(TinyNet(width=256))
    path = tmp_path / "tiny.safetensors"
    save_model(reference, str(path))
    model = meta_tiny(width=256)
    map_weights(model, path, strict=True)
    model.inv_freq = reference.inv_freq.clone()

    released: list[tuple[int, int]] = []  # (partition being built, storage address)
    current = [-1]

    original = weightmap.release.release_mapped_storage

    def spy(storage: torch.UntypedStorage) -> bool:
        result = original(storage)
        assert result, "a mapped weight was not recognised as mapped"
        released.append((current[0], storage.data_ptr()))
        return result

    monkeypatch.setattr(weightmap.release, "release_mapped_storage", spy)
    parts = model.partitions()
    plan = ReleasePlan.from_names(model, parts, reread=False)  # each weight once, after its last reader
    params = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    last = {}
    for i, names in enumerate(parts):
        for n in names:
            last[params[n].untyped_storage().data_ptr()] = i

    engines = []
    for i, names in enumerate(parts):
        current[0] = i
        engines.append({n: params[n].clone() for n in names})  # the "engine" copies what it reads
        # nothing this partition or a later one reads may be released before now
        assert all(last[ptr] < i for _, ptr in released)
        step = plan.built(i)
        assert step.kept == 0
    assert sorted(ptr for _, ptr in released) == sorted(last)  # every weight, once
    for when, ptr in released:
        assert when == last[ptr], "released before or after its last partition"
    tied_ptr = model.embed.weight.untyped_storage().data_ptr()
    assert [w for w, p in released if p == tied_ptr] == [3]

    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    built = {k: v for engine in engines for k, v in engine.items()}
    out = torch.func.functional_call(model, built, (tokens,), tie_weights=False)
    torch.testing.assert_close(out, reference(tokens))
    # The released weights read correctly again, straight from the file.
    for name, t in model.state_dict().items():
        torch.testing.assert_close(t, reference.state_dict()[name], rtol=0, atol=0)
    torch.testing.assert_close(model(tokens), reference(tokens))


def test_plan_rejects_out_of_order_partitions(tmp_path: Path) -> None:
    model = TinyNet()
    plan = ReleasePlan.from_names(model, model.partitions())
    with pytest.raises(ValueError, match="partition 1 reported built, but partition 0 is next"):
        plan.built(1)
    with pytest.raises(KeyError, match="nope"):
        ReleasePlan.from_names(model, [["nope"]])


def test_plan_releases_ordinary_storages_by_resizing_when_asked() -> None:
    model = TinyNet()
    parts = model.partitions()
    plan = ReleasePlan.from_names(model, parts, resize=True)
    total = plan.pending_bytes
    steps = [plan.built(i) for i in range(len(parts))]
    assert sum(s.released_bytes for s in steps) == total
    assert plan.pending_bytes == 0
    assert model.blocks[0].weight.untyped_storage().nbytes() == 0
    assert model.embed.weight.untyped_storage().nbytes() == 0
    assert steps[0].released == 1  # only "scale": the tied embedding waits for the head


def test_rss_of_mapping_falls_after_release(tmp_path: Path) -> None:
    path = tmp_path / "r.safetensors"
    write_buffers(path, ["a", "b"], pages=256)
    model = Buffers(["a", "b"], pages=256)
    map_weights(model, path)
    assert smaps_rss(path) < 8 * PAGE, "mapping must not read the data"
    model.a.sum()
    model.b.sum()
    full = smaps_rss(path)
    assert full >= 500 * PAGE
    release_mapped_storage(model.a)
    half = smaps_rss(path)
    assert full - half >= 250 * PAGE
    release_mapped_storage(model.b)
    assert smaps_rss(path) <= 4 * PAGE


def test_without_madvise_release_is_refused_and_nothing_breaks(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.safetensors"
    write_buffers(path, ["a"], pages=8)
    model = Buffers(["a"], pages=8)
    map_weights(model, path)
    model.a.fill_(5)
    monkeypatch.setattr(weightmap.release, "madvise_supported", lambda: False)
    assert release_mapped_storage(model.a) is False
    assert release_storage(model.a, resize=True) is False  # not resizable either: left alone
    assert bool((model.a == 5).all()), "nothing was dropped"
    plain = torch.ones(16)
    assert release_storage(plain, resize=True) is True  # ordinary storages are still freed


def test_big_endian_hosts_get_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "e.safetensors"
    write_buffers(path, ["a"], pages=1)
    monkeypatch.setattr("sys.byteorder", "big")
    model = Buffers(["a"], pages=1)
    with pytest.raises(MappingError, match="little-endian"):
        map_weights(model, path)
    assert model.a.device.type == "meta"
