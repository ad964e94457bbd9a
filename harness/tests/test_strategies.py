"""The strategy registry: one entry per strategy of the catalog, read by the worker and the plan; scenario
validation and the figures read the catalog."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from harness.catalog import (
    FETCHED_PER_ENGINE,
    STRATEGY_LISTINGS,
    StrategyListing,
    strategy_colour,
    strategy_label,
)
from harness.load.peers import READ_FILE_BACKENDS, read_file_backend
from harness.load.strategies import STRATEGIES, ReadFileHooks
from harness.plan import make_plan
from harness.scenario import ScenarioError, load_scenario
from harness.units import MIB
from harness.worker import measure

SCENARIO = """
name = "t"
strategies = [{names}]
[model]
source = "synthetic"
layers = 1
width = 64
heads = 4
vocab = 64
[build]
engines = 1
"""


def write(tmp_path: Path, *names: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.format(names=", ".join(f'"{n}"' for n in names)))
    return path


def test_scenarios_accept_exactly_the_catalogs_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ScenarioError, match="unknown strategy 'other' .known: map, load, load_file, torch_mmap, "
                                            "stream"):
        load_scenario(write(tmp_path, "map", "other"))
    monkeypatch.setitem(STRATEGY_LISTINGS, "other", StrategyListing("other", "another", "#000000"))
    assert load_scenario(write(tmp_path, "map", "other")).strategies == ("map", "other")


def test_the_registry_has_an_entry_for_each_name_of_the_catalog_in_its_order() -> None:
    assert list(STRATEGIES) == list(STRATEGY_LISTINGS)
    assert all(s.name == name for name, s in STRATEGIES.items())
    from harness.scenario import Scenario

    default = Scenario.__dataclass_fields__["strategies"].default
    assert default == tuple(n for n, s in STRATEGY_LISTINGS.items() if s.package is None), \
        "a scenario that lists none runs every strategy that needs no optional package"
    assert {"map", "load", "stream", "read_file"} <= set(default)
    assert not {"st_prefetch", "fastsafetensors", "instanttensor"} & set(default)


def test_the_catalog_names_what_each_strategy_with_per_engine_hooks_does_in_an_engines_span() -> None:
    # the engine-times figure says what the rest of an engine's span holds for these strategies
    assert set(FETCHED_PER_ENGINE) == {name for name, s in STRATEGIES.items() if s.hooks is not None}


def test_every_strategy_has_its_own_colour_and_label() -> None:
    colours = [s.colour for s in STRATEGY_LISTINGS.values()]
    assert len(set(colours)) == len(colours)
    assert all(s.label and s.name == name for name, s in STRATEGY_LISTINGS.items())
    assert strategy_colour("map", ["map"]) == STRATEGY_LISTINGS["map"].colour
    assert strategy_label("map") == STRATEGY_LISTINGS["map"].label and strategy_label("old_a") == ""
    # names the registry does not know (results of another version) still get distinct colours
    order = ["map", "old_a", "old_b"]
    assert len({strategy_colour(n, order) for n in order}) == 3


def test_release_note_says_what_happened() -> None:
    assert "madvise" in STRATEGIES["map"].release_note(True, 0)
    assert "resized to 0" in STRATEGIES["load"].release_note(True, 0)
    assert "not resizable" in STRATEGIES["load_file"].release_note(True, 1)
    assert STRATEGIES["map"].release_note(False, 10).startswith("release = false")
    assert "not resizable" in STRATEGIES["torch_mmap"].release_note(True, 1)
    assert "unmaps" in STRATEGIES["stream"].release_note(True, 0)


class _Recorder:
    """Hooks that note each call and check the engine's tensors are in the model when it is built."""

    def __init__(self, model: torch.nn.Module, path: Path, device: str, partitions: Sequence[Sequence[str]]) -> None:
        self.model, self.path, self.device, self.partitions = model, path, device, partitions
        self.calls: list[tuple[str, int, int]] = []
        CALLS.append(self)

    def before(self, index: int, names: Sequence[str]) -> None:
        named = dict(self.model.named_parameters(remove_duplicate=False))
        assert all(not named[n].is_meta for n in names if n in named)
        self.calls.append(("before", index, len(names)))

    def after(self, index: int, names: Sequence[str]) -> int:
        self.calls.append(("after", index, len(names)))
        return 1000 + index  # what a loader that drops its own copies would report


CALLS: list[_Recorder] = []


def test_the_worker_calls_a_strategys_hooks_around_each_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooked = dataclasses.replace(STRATEGIES["map"], name="hooked", hooks=_Recorder)
    monkeypatch.setitem(STRATEGIES, "hooked", hooked)
    monkeypatch.setitem(STRATEGY_LISTINGS, "hooked", StrategyListing("hooked", "map with hooks", "#000000"))
    path = write(tmp_path, "hooked")
    path.write_text(path.read_text().replace("engines = 1", "engines = 3"))
    scenario = load_scenario(path)
    scenario = dataclasses.replace(scenario, checkpoint=dataclasses.replace(
        scenario.checkpoint, path=tmp_path / "c.safetensors", generate=True))
    plan = make_plan(scenario, name="t", workdir=tmp_path / "engines")
    record = measure(plan, "hooked", tmp_path / "out")
    assert record.ok, record.error
    (recorder,) = CALLS
    sizes = [len(e.names) for e in plan.engines]
    assert recorder.calls == [(step, i, sizes[i]) for i in range(3) for step in ("before", "after")]
    assert recorder.device == plan.device, "the hooks are told the device the engines are built on"
    assert [list(p) for p in recorder.partitions] == [list(e.names) for e in plan.engines]
    mapped = measure(plan, "map", tmp_path / "plain")
    assert [e.released_bytes for e in record.engines] == [
        (e.released_bytes or 0) + 1000 + e.index for e in mapped.engines
    ], "what the hooks released counts with the release plan's"


def _plan(tmp_path: Path, *names: str, engines: int = 3):  # noqa: ANN202
    path = write(tmp_path, *names)
    path.write_text(path.read_text().replace("engines = 1", f"engines = {engines}"))
    scenario = load_scenario(path)
    scenario = dataclasses.replace(scenario, checkpoint=dataclasses.replace(
        scenario.checkpoint, path=tmp_path / "c.safetensors", generate=True))
    return make_plan(scenario, name="t", workdir=tmp_path / "engines")


def test_torch_mmap_is_converted_by_the_plan_and_kept_unreleased(tmp_path: Path) -> None:
    from harness.load.peers import converted_path

    plan = _plan(tmp_path, "torch_mmap")
    pt = converted_path(tmp_path / "c.safetensors")
    assert pt.is_file(), "the plan makes the .pt once, before any measured run"
    assert STRATEGIES["torch_mmap"].files_read(tmp_path / "c.safetensors") == (pt,)
    record = measure(plan, "torch_mmap", tmp_path / "out")
    assert record.ok, record.error
    assert record.released_bytes == 0
    assert record.unreleased_bytes >= plan.model.bytes
    assert "not resizable" in record.release_note


def test_stream_puts_each_engines_weights_in_place_and_takes_them_out(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from harness.models import build_model

    plan = _plan(tmp_path, "stream")
    model = build_model(plan.scenario.model).module
    partitions = [e.names for e in plan.engines]
    hooks = STRATEGIES["stream"].hooks(model, tmp_path / "c.safetensors", plan.device, partitions)  # type: ignore[misc]
    stored = load_file(str(tmp_path / "c.safetensors"))
    released = 0
    for engine in plan.engines:
        hooks.before(engine.index, engine.names)
        named: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
        named.update(model.named_buffers(remove_duplicate=False))
        held = [n for n in engine.names if n in stored]
        assert held and all(torch.equal(named[n], stored[n]) for n in held)
        others = [n for n in named if n in stored and n not in engine.names]
        assert all(named[n].is_meta for n in others), "only this engine's weights are in the model"
        released += hooks.after(engine.index, engine.names)
        named = dict(model.named_parameters(remove_duplicate=False))  # type: ignore[arg-type]
        assert all(named[n].is_meta for n in held if n in named), "the engine's weights are taken out again"
    # a tied tensor read by two engines is loaded, and dropped, twice, and counts once: released <= 100%
    assert released == plan.model.bytes
    record = measure(plan, "stream", tmp_path / "out")
    assert record.ok, record.error
    assert record.released_bytes == released
    assert "unmaps" in record.release_note


def test_read_file_reads_each_engines_weights_into_buffers_dropped_after_it(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from harness.models import build_model

    plan = _plan(tmp_path, "read_file")
    model = build_model(plan.scenario.model).module
    partitions = [e.names for e in plan.engines]
    hooks = STRATEGIES["read_file"].hooks(model, tmp_path / "c.safetensors", plan.device, partitions)  # type: ignore[misc]
    assert isinstance(hooks, ReadFileHooks) and hooks.loader.backend in READ_FILE_BACKENDS
    stored = load_file(str(tmp_path / "c.safetensors"))
    released = 0
    for engine in plan.engines:
        hooks.before(engine.index, engine.names)
        named: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
        held = [n for n in engine.names if n in stored and n in named]
        assert all(torch.equal(named[n], stored[n]) for n in held)
        released += hooks.after(engine.index, engine.names)
        named = dict(model.named_parameters(remove_duplicate=False))
        assert all(named[n].is_meta for n in held), "the engine's weights are taken out again"
    assert released == plan.model.bytes
    record = measure(plan, "read_file", tmp_path / "out")
    assert record.ok, record.error
    assert record.released_bytes == released
    assert "safetensors' own buffers" in record.release_note


def _mapping_of(address: int) -> str:
    """The path of the mapping holding ``address`` in this process ("" for anonymous memory)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) > 5 else ""
    raise AssertionError(f"{address:#x} is in no mapping")


def test_read_files_tensors_are_copies_the_loader_lets_go(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from harness.load.peers import StreamLoader

    path = tmp_path / "w.safetensors"
    save_file({"w": torch.randn(4 * MIB // 4)}, str(path))  # 4 MiB of float32
    copies = StreamLoader(path, backend=read_file_backend(path))
    views = StreamLoader(path)  # stream's: safetensors' mapping of the file
    copy, view = copies.load(["w"])["w"], views.load(["w"])["w"]
    assert torch.equal(copy, view)
    assert _mapping_of(view.data_ptr()) == str(path), "stream's tensors are views of the file"
    assert not _mapping_of(copy.data_ptr()).endswith(".safetensors"), "read_file's are copies in memory of its own"
    assert copies.drop(["w"]) == {"w": 4 * MIB} and copies.resident_bytes == 0


def test_read_file_says_plainly_when_safetensors_lacks_the_backend(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.load.peers as peers

    plan = _plan(tmp_path, "read_file")
    monkeypatch.setattr(peers, "READ_FILE_BACKENDS", ("no_such_backend",))
    with pytest.raises(RuntimeError, match=r"safetensors [0-9.]+ has no pread backend .*read_file cannot run here"):
        read_file_backend(tmp_path / "c.safetensors")
    record = measure(plan, "read_file", tmp_path / "out")
    assert not record.ok and "has no pread backend" in (record.error or "")


class _WithIndexBuffer(torch.nn.Module):
    """A weight the checkpoint holds and an index buffer it does not (as SigLIP's position ids)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(4096, 8)
        self.register_buffer("position_ids", torch.zeros(1, 4096, dtype=torch.int64), persistent=False)


@pytest.mark.parametrize("name", ["map", "load", "load_file"])
def test_every_loader_leaves_non_persistent_buffers_to_the_same_fill(tmp_path: Path, name: str) -> None:
    from safetensors.torch import save_file

    from harness.models import fill_non_persistent
    from harness.models.base import pattern

    path = tmp_path / "w.safetensors"
    weight = torch.randn(4096, 8)
    save_file({"embed.weight": weight}, str(path))
    with torch.device("meta"):
        model = _WithIndexBuffer()
    loaded = STRATEGIES[name].load(model, path).model
    fill_non_persistent(loaded)
    # load's to_empty must not leave uninitialised memory here: an engine indexing with it
    # reads out of bounds, and eager (which maps) would disagree with the built model
    assert torch.equal(loaded.get_buffer("position_ids"), pattern((1, 4096), torch.int64))
    assert torch.equal(loaded.get_parameter("embed.weight"), weight)
