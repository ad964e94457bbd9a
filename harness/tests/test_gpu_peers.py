"""The GPU loader peers (:mod:`harness.load.gpu_peers`): listed alike by the catalog, the registry and the H200
scenario; unavailable with one line naming the package and version (or the device) they need; and their per-engine
hooks, run here with fake packages injected in ``sys.modules`` that hand out CPU tensors (and fastsafetensors' own
CPU path where it is installed)."""

from __future__ import annotations

import dataclasses
import gc
import importlib
import json
import sys
import types
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open as real_safe_open
from safetensors.torch import load_file, save_file

from harness.catalog import FETCHED_PER_ENGINE, STRATEGY_LISTINGS
from harness.cli import main
from harness.load.gpu_loaders import LOADER_HOOKS
from harness.load.gpu_peers import (
    FastSafetensorsHooks,
    InstantTensorHooks,
    LoaderUnavailable,
    StPrefetchHooks,
    instant_sizes,
    load_fastsafetensors,
    load_instanttensor,
    load_st_prefetch,
)
from harness.load.gpu_whole import FastSafetensorsWholeHooks, InstantTensorWholeHooks, StPrefetchWholeHooks
from harness.load.strategies import STRATEGIES
from harness.plan import Plan, make_plan
from harness.scenario import load_scenario
from harness.tests.tiny_scenario import tiny_scenario_text
from harness.units import GIB, MIB
from harness.worker import measure

ROOT = Path(__file__).resolve().parents[2]
GPU_PEERS: dict[str, Any] = {"st_prefetch": StPrefetchHooks, "st_prefetch_whole": StPrefetchWholeHooks,
                             "fastsafetensors": FastSafetensorsHooks,
                             "fastsafetensors_whole": FastSafetensorsWholeHooks,
                             "instanttensor": InstantTensorHooks, "instanttensor_whole": InstantTensorWholeHooks}

def _plan(tmp_path: Path, *names: str, engines: int = 3) -> Plan:
    path = tmp_path / "s.toml"
    listed = ", ".join(f'"{n}"' for n in names)
    path.write_text(tiny_scenario_text(tmp_path / "c.safetensors", {'strategies = ["map"]': f"strategies = [{listed}]",
                                                                    "engines = 2": f"engines = {engines}"}))
    return make_plan(load_scenario(path), name="t", workdir=tmp_path / "engines")


def _model(plan: Plan) -> torch.nn.Module:
    from harness.models import build_model

    return build_model(plan.scenario.model).module


def _named(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    named: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))
    return named


# --------------------------------------------------------------------------- listings


def test_the_catalog_the_registry_and_the_h200_scenario_list_the_gpu_peers() -> None:
    assert list(STRATEGIES)[-6:] == list(STRATEGY_LISTINGS)[-6:] == list(GPU_PEERS) == list(LOADER_HOOKS)
    for name, hooks in GPU_PEERS.items():
        assert STRATEGIES[name].hooks is hooks
        assert STRATEGY_LISTINGS[name].variant_of is None, "a peer of its own, not a variant"
        assert name in FETCHED_PER_ENGINE
    colours = [s.colour.upper() for s in STRATEGY_LISTINGS.values()]
    assert len(set(colours)) == len(colours)
    scenario = load_scenario(ROOT / "scenarios" / "pi05-h200.toml")
    assert set(GPU_PEERS) <= set(scenario.strategies)


# --------------------------------------------------------------------------- unavailable


def _without_prefetch(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("safetensors")
    fake.__version__ = "0.8.0"  # type: ignore[attr-defined]
    fake.safe_open = type("safe_open", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "safetensors", fake)


def test_st_prefetch_without_safe_open_prefetch_names_the_version_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without_prefetch(monkeypatch)
    with pytest.raises(LoaderUnavailable) as raised:
        load_st_prefetch(torch.nn.Linear(1, 1), tmp_path / "c.safetensors")
    message = str(raised.value)
    assert "\n" not in message
    assert "safetensors >= 0.9.0rc1" in message and "0.8.0 is installed" in message
    assert "pip install --pre safetensors==0.9.0rc1" in message
    with pytest.raises(LoaderUnavailable, match="0.9.0rc1"):
        StPrefetchHooks(torch.nn.Linear(1, 1), tmp_path / "c.safetensors", "cuda:0", [])


@pytest.mark.parametrize(("name", "load", "hooks", "version"), [
    ("fastsafetensors", load_fastsafetensors, FastSafetensorsHooks, "0.5.0"),
    ("instanttensor", load_instanttensor, InstantTensorHooks, "0.2.2"),
])
def test_a_missing_package_is_named_with_its_version(
    name: str, load: Any, hooks: Any, version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    for attempt in (lambda: load(torch.nn.Linear(1, 1), tmp_path / "c.safetensors"),
                    lambda: hooks(torch.nn.Linear(1, 1), tmp_path / "c.safetensors", "cuda:0", [])):
        with pytest.raises(LoaderUnavailable) as raised:
            attempt()
        message = str(raised.value)
        assert "\n" not in message and f"pip install {name}=={version}" in message
        assert message.startswith(f"{name} needs the {name} package ({version})")


@pytest.mark.parametrize("name", ["st_prefetch", "st_prefetch_whole", "instanttensor", "instanttensor_whole"])
def test_the_cuda_only_peers_refuse_a_cpu_build_in_one_line(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_fakes(monkeypatch, [])
    with pytest.raises(LoaderUnavailable, match=f"^{tmp_path / 's.toml'}: strategies: {name} needs a CUDA device; "
                                                "this run builds on cpu$"):
        _plan(tmp_path, name, engines=2)
    plan = _plan(tmp_path, "map", engines=2)  # the strategy's own process checks again
    with pytest.raises(LoaderUnavailable, match=f"^{name} needs a CUDA device; this run builds on cpu$"):
        GPU_PEERS[name](_model(plan), tmp_path / "c.safetensors", "cpu", [e.names for e in plan.engines])
    record = measure(plan, name, tmp_path / "out", check=False)
    assert not record.ok
    assert record.error == f"LoaderUnavailable: {name} needs a CUDA device; this run builds on cpu"


def test_a_missing_package_fails_the_strategys_process_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path, "map", engines=2)
    monkeypatch.setitem(sys.modules, "fastsafetensors", None)
    record = measure(plan, "fastsafetensors", tmp_path / "out", check=False)
    assert not record.ok and record.error is not None
    assert record.error.startswith("LoaderUnavailable: fastsafetensors needs the fastsafetensors package (0.5.0)")


UNAVAILABLE = {
    # a peer this machine cannot run: the peer, the device the plan resolves, how it is made so, what it needs
    "st_prefetch on safetensors 0.8": ("st_prefetch", "cuda:0", "without prefetch",
                                       "st_prefetch needs safetensors >= 0.9.0rc1 (safe_open.prefetch); safetensors "
                                       "0.8.0 is installed: pip install --pre safetensors==0.9.0rc1"),
    "st_prefetch on the cpu": ("st_prefetch", "cpu", "fakes",
                               "st_prefetch needs a CUDA device; this run builds on cpu"),
    "instanttensor not installed": ("instanttensor", "cuda:0", "missing",
                                    "instanttensor needs the instanttensor package (0.2.2), which is not installed: "
                                    "pip install instanttensor==0.2.2 (optional: not among the project's "
                                    "dependencies)"),
    "instanttensor on the cpu": ("instanttensor", "cpu", "fakes",
                                 "instanttensor needs a CUDA device; this run builds on cpu"),
    "fastsafetensors not installed": ("fastsafetensors", "cpu", "missing",
                                      "fastsafetensors needs the fastsafetensors package (0.5.0), which is not "
                                      "installed: pip install fastsafetensors==0.5.0 (optional: not among the "
                                      "project's dependencies)"),
    "fastsafetensors that does not import": ("fastsafetensors", "cpu", "broken",
                                             "fastsafetensors needs the fastsafetensors package (0.5.0), which does "
                                             "not import here (OSError: libcufile.so: cannot open shared object "
                                             "file): pip install fastsafetensors==0.5.0"),
}


def _make_unavailable(monkeypatch: pytest.MonkeyPatch, name: str, how: str) -> None:
    if how == "without prefetch":
        _without_prefetch(monkeypatch)
    elif how == "fakes":
        _install_fakes(monkeypatch, [])
    elif how == "missing":
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    else:
        monkeypatch.delitem(sys.modules, name, raising=False)
        real = importlib.import_module

        def broken(module: str, *args: Any) -> Any:
            if module == name:
                raise OSError("libcufile.so: cannot open shared object file")
            return real(module, *args)

        monkeypatch.setattr("harness.load.gpu_peers.importlib.import_module", broken)


@pytest.mark.parametrize("case", sorted(UNAVAILABLE))
def test_a_peer_that_cannot_run_here_is_refused_before_any_strategy_runs(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name, device, how, needs = UNAVAILABLE[case]
    _make_unavailable(monkeypatch, name, how)
    monkeypatch.setattr("harness.plan.resolve_device", lambda asked: device)  # a GPU machine, where it says cuda
    started: list[str] = []

    def command(plan: Path, strategy: str, out: Path) -> list[str]:
        started.append(strategy)
        return [sys.executable, "-c", "raise SystemExit(1)"]

    monkeypatch.setattr("harness.run.worker_command", command)
    path = tmp_path / "s.toml"
    path.write_text(tiny_scenario_text(tmp_path / "c.safetensors",
                                       {'strategies = ["map"]': f'strategies = ["map", "{name}"]'}))
    results = tmp_path / "results"
    assert main(["run", str(path), "--results", str(results)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"error: {path}: strategies: {needs}", err[-1]
    assert started == [], "no strategy ran"
    assert not results.exists() or list(results.iterdir()) == [], "nothing is published, no staging is left"


# --------------------------------------------------------------------------- fakes


@dataclasses.dataclass
class _Log:
    """What the fake packages were asked, in order, and what they handed out: each tensor's name and element
    count, and a weak reference to it (which says whether anything still holds it)."""

    calls: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)
    handed: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    refs: list[tuple[str, weakref.ref[torch.Tensor]]] = dataclasses.field(default_factory=list)

    def hand(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        self.handed.append((name, tensor.numel()))
        self.refs.append((name, weakref.ref(tensor)))
        return tensor

    def alive(self) -> list[str]:
        """The names of the handed tensors something still holds."""
        gc.collect()
        return [name for name, ref in self.refs if ref() is not None]


def _read(file: str, name: str) -> torch.Tensor:
    with real_safe_open(file, framework="pt") as handle:
        return handle.get_tensor(name).clone()


def _in_file_order(files: Sequence[str], keep: Any) -> Iterator[tuple[str, str]]:
    """(file, name) of each tensor of ``files`` that ``keep(name)`` keeps, in file order (sorted files, then data
    offsets), as fastsafetensors' and instanttensor's iterators hand them out."""
    for file in sorted(files):
        with real_safe_open(file, framework="pt") as handle:
            names = list(handle.keys())
        header = json.loads(Path(file).read_bytes()[8:8 + int.from_bytes(Path(file).read_bytes()[:8], "little")])
        names.sort(key=lambda n: header[n]["data_offsets"][0])
        yield from ((file, n) for n in names if keep(n))


def _install_fakes(monkeypatch: pytest.MonkeyPatch, calls: list[tuple[Any, ...]]) -> _Log:
    """Fake ``safetensors`` (with ``prefetch``), ``fastsafetensors`` and ``instanttensor`` in ``sys.modules``, which
    read the real files and hand out CPU tensors, logging each call in ``calls``."""
    log = _Log(calls)

    class PrefetchLoader:
        def __init__(self, file: str, plan: dict[str, Any], device: Any, threads: int) -> None:
            self.file, self.plan, self.taken = file, plan, set[str]()
            calls.append(("prefetch", file, tuple(plan), device, threads))

        def names(self) -> list[str]:
            return list(self.plan)

        def take(self, name: str) -> torch.Tensor:
            assert name in self.plan and name not in self.taken, f"{name} taken twice or not planned"
            self.taken.add(name)
            calls.append(("take", self.file, name))
            return log.hand(name, _read(self.file, name))

        def close(self) -> None:
            calls.append(("close", self.file, tuple(self.plan)))

    class SafeOpen:
        def __init__(self, file: str, framework: str, device: str = "cpu") -> None:
            assert framework == "pt"
            self.file = file

        def prefetch(self, plan: dict[str, Any] | None = None, *, device: Any = None,
                     threads: int = 8) -> PrefetchLoader:
            assert plan is not None
            return PrefetchLoader(self.file, plan, device, threads)

    safetensors = types.ModuleType("safetensors")
    safetensors.__version__ = "0.9.0rc1"  # type: ignore[attr-defined]
    safetensors.safe_open = SafeOpen  # type: ignore[attr-defined]

    class ParallelLoader:
        def __init__(self, pg: Any, hf_weights_files: list[str], *, device: str, nogds: bool,
                     use_tqdm_on_load: bool, tensor_filter: Any, max_batch_bytes: int | None = None) -> None:
            assert pg is None and not use_tqdm_on_load
            self.files, self.keep = list(hf_weights_files), tensor_filter
            calls.append(("parallel", tuple(hf_weights_files), device, nogds, max_batch_bytes))

        def iterate_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
            try:
                for file, name in _in_file_order(self.files, self.keep):
                    yield name, log.hand(name, _read(file, name))
            finally:
                calls.append(("iterate_close",))

        def close(self) -> None:
            calls.append(("parallel_close",))

    fastsafetensors = types.ModuleType("fastsafetensors")
    fastsafetensors.__version__ = "0.5.0"  # type: ignore[attr-defined]
    fastsafetensors.ParallelLoader = ParallelLoader  # type: ignore[attr-defined]

    class InstantOpen:
        def __init__(self, files: list[str], framework: str, device: str, *, tensor_filter: list[str],
                     tensor_name_match_mode: str, **sizes: int) -> None:
            assert framework == "pt" and tensor_name_match_mode == "exact"
            assert set(sizes) <= {"buffer_size", "chunk_size", "io_depth"}, sizes
            self.files, self.names = files, list(tensor_filter)
            calls.append(("instant_open", tuple(files), device, tuple(tensor_filter), sizes))

        def __enter__(self) -> InstantOpen:
            return self

        def __exit__(self, *exc: object) -> None:
            calls.append(("instant_close",))

        def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
            for file, name in _in_file_order(self.files, set(self.names).__contains__):
                yield name, log.hand(name, _read(file, name))

    instanttensor = types.ModuleType("instanttensor")
    instanttensor.safe_open = InstantOpen  # type: ignore[attr-defined]

    monkeypatch.setitem(sys.modules, "safetensors", safetensors)
    monkeypatch.setitem(sys.modules, "fastsafetensors", fastsafetensors)
    monkeypatch.setitem(sys.modules, "instanttensor", instanttensor)
    return log


# --------------------------------------------------------------------------- hooks


def _walk(hooks: Any, plan: Plan, model: torch.nn.Module, stored: dict[str, torch.Tensor],
          each: Any = None) -> int:
    """Run ``hooks`` over ``plan``'s engines as the worker does, checking the model before and after each; the
    released bytes."""
    released = 0
    for engine in plan.engines:
        hooks.before(engine.index, engine.names)
        named = _named(model)
        held = [n for n in engine.names if n in stored]
        assert held and all(torch.equal(named[n], stored[n]) for n in held), "the engine's weights are in place"
        params = dict(model.named_parameters(remove_duplicate=False))
        assert all(isinstance(params[n], torch.nn.Parameter) for n in held if n in params)
        others = [n for n in named if n in stored and n not in engine.names]
        assert all(named[n].is_meta for n in others), "only this engine's weights are in the model"
        if each is not None:
            each(engine.index)
        released += hooks.after(engine.index, engine.names)
        named = _named(model)
        assert all(named[n].is_meta for n in held), "the engine's weights are taken out again"
    return released


def test_st_prefetch_starts_the_next_engine_and_takes_this_ones_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path, "map", engines=3)
    stored = load_file(str(tmp_path / "c.safetensors"))
    calls: list[tuple[Any, ...]] = []
    _install_fakes(monkeypatch, calls)
    model = _model(plan)
    partitions = [e.names for e in plan.engines]
    hooks = StPrefetchHooks(model, tmp_path / "c.safetensors", "cuda:0", partitions)
    stored_of = {n: hooks.stored(n) for p in partitions for n in p}
    started: list[list[int]] = []

    def check(index: int) -> None:
        started.append(hooks.started())
        prefetched = [c for c in calls if c[0] == "prefetch"]
        assert prefetched[-1][2] == tuple(dict.fromkeys(
            stored_of[n] for n in partitions[min(index + 1, len(partitions) - 1)] if stored_of[n] in stored))
        assert all(c[3] == 0 and c[4] == 8 for c in prefetched), "device ordinal 0, 8 threads"

    released = _walk(hooks, plan, model, stored, check)
    assert started == [[0, 1], [1, 2], [2]], "engine k + 1's loader is started in before(k), k's closed in after(k)"
    assert hooks.started() == []
    order = [c[0] for c in calls if c[0] in ("prefetch", "close")]
    assert order == ["prefetch", "prefetch", "close", "prefetch", "close", "close"]
    # the tied tensor read by the first and the last engine is taken by each, and counts once
    assert released == plan.model.bytes


def _tied_names(model: torch.nn.Module) -> list[str]:
    from weightmap import collect_targets

    groups = [t.names for t in collect_targets(model) if len(t.names) > 1]
    assert groups, "the synthetic model ties a tensor"
    return list(groups[0])


@pytest.mark.parametrize("name", list(GPU_PEERS))
def test_tied_names_in_one_engine_share_one_parameter_and_count_once(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path, "map", engines=1)
    stored = load_file(str(tmp_path / "c.safetensors"))
    calls: list[tuple[Any, ...]] = []
    log = _install_fakes(monkeypatch, calls)
    model = _model(plan)
    tied = _tied_names(model)
    (engine,) = plan.engines
    hooks = GPU_PEERS[name](model, tmp_path / "c.safetensors", "cuda:0", [engine.names])
    hooks.before(0, engine.names)
    params = dict(model.named_parameters(remove_duplicate=False))
    assert len({id(params[n]) for n in tied}) == 1, "one parameter for the tied names"
    assert len(log.handed) == len(stored), "each stored tensor fetched once"
    assert hooks.after(0, engine.names) == plan.model.bytes
    assert all(p.is_meta for p in model.parameters())


@pytest.mark.parametrize("name", ["fastsafetensors", "instanttensor"])
def test_the_per_engine_peers_fetch_only_the_engines_tensors_with_buffers_sized_to_it_and_let_go_after_it(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path, "map", engines=3)
    stored = load_file(str(tmp_path / "c.safetensors"))
    calls: list[tuple[Any, ...]] = []
    log = _install_fakes(monkeypatch, calls)
    model = _model(plan)
    partitions = [e.names for e in plan.engines]
    hooks = GPU_PEERS[name](model, tmp_path / "c.safetensors", "cuda:0", partitions)
    opened: list[int] = []

    def check(index: int) -> None:
        wanted = {hooks.stored(n) for n in partitions[index]} & set(stored)
        nbytes = sum(stored[n].numel() * stored[n].element_size() for n in wanted)
        handed = log.handed[-len(wanted):]
        assert len(log.handed) == sum(len({hooks.stored(n) for n in p} & set(stored)) for p in partitions[:index + 1])
        assert sorted(count for _, count in handed) == sorted(stored[n].numel() for n in wanted)
        opened.append(len(calls))
        if name == "instanttensor":
            assert calls[-1] == ("instant_close",), "the handle is closed once the clones are made"
            assert set(calls[-2][3]) == wanted and calls[-2][2] == "cuda:0"
            assert calls[-2][4] == instant_sizes(nbytes), "the ring buffer and I/O depth sized to the engine"
        else:
            assert calls[-2] == ("parallel", (str(tmp_path / "c.safetensors"),), "cuda:0", True, nbytes), \
                "nogds without /dev/nvidia-fs0; the device buffer spans at most the engine's bytes"
            assert calls[-1] == ("iterate_close",), "the iterator closed once the engine's clones are made"

    released = _walk(hooks, plan, model, stored, check)
    assert released == plan.model.bytes
    assert log.alive() == [], "every clone dropped"
    if name == "fastsafetensors":
        assert [c for c in calls if c[0] == "parallel_close"] == [("parallel_close",)] * len(partitions)
        assert opened and all(calls[i][0] == "parallel_close" for i in opened), "closed in after(), not before"


@pytest.mark.parametrize("nbytes", [1, 4096, 8 * MIB, 16 * MIB, 16 * MIB + 1, 600 * MIB, 9 * GIB])
def test_instanttensor_per_engine_sizes_fit_the_engine_and_each_other(nbytes: int) -> None:
    sizes = instant_sizes(nbytes)
    chunk = sizes["chunk_size"]
    assert sizes["buffer_size"] == max(nbytes, 2 * chunk), "the engine's bytes, at least two reads"
    assert 1 <= sizes["io_depth"] <= 1024, "instanttensor's bounds"
    # buffer and depth compatible: each read plus a page of alignment guard fits the buffer
    assert sizes["io_depth"] * (chunk + 4096) <= sizes["buffer_size"]
    assert sizes["io_depth"] == 1024 or sizes["io_depth"] * chunk > sizes["buffer_size"] - 2 * chunk, \
        "as deep as the buffer allows"


def test_st_prefetch_plans_per_file_of_a_sharded_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    first, second = {k: state[k] for k in ("0.weight", "1.weight")}, {k: state[k] for k in ("0.bias", "1.bias")}
    save_file(first, str(tmp_path / "a.safetensors"))
    save_file(second, str(tmp_path / "b.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {**dict.fromkeys(first, "a.safetensors"),
                                                **dict.fromkeys(second, "b.safetensors")}}))
    calls: list[tuple[Any, ...]] = []
    _install_fakes(monkeypatch, calls)
    meta = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).to("meta")
    engines: list[Sequence[str]] = [["0.weight", "0.bias"], ["1.weight", "1.bias"]]
    hooks = StPrefetchHooks(meta, index, "cuda:0", engines)
    hooks.before(0, engines[0])
    prefetched = {(Path(c[1]).name, c[2]) for c in calls if c[0] == "prefetch"}
    assert prefetched == {("a.safetensors", ("0.weight",)), ("b.safetensors", ("0.bias",)),
                          ("a.safetensors", ("1.weight",)), ("b.safetensors", ("1.bias",))}
    assert all(torch.equal(meta.get_parameter(n), state[n]) for n in engines[0])
    assert hooks.after(0, engines[0]) == sum(state[n].numel() * 4 for n in engines[0])
    assert sorted(Path(c[1]).name for c in calls if c[0] == "close") == ["a.safetensors", "b.safetensors"]


# --------------------------------------------------------------------------- fastsafetensors on the CPU


def test_fastsafetensors_builds_on_the_cpu(tmp_path: Path) -> None:
    pytest.importorskip("fastsafetensors")
    plan = _plan(tmp_path, "fastsafetensors", engines=3)
    stored = load_file(str(tmp_path / "c.safetensors"))
    model = _model(plan)
    hooks = FastSafetensorsHooks(model, tmp_path / "c.safetensors", "cpu", [e.names for e in plan.engines])
    assert hooks.nogds
    assert _walk(hooks, plan, model, stored) == plan.model.bytes
    record = measure(plan, "fastsafetensors", tmp_path / "out")
    assert record.ok, record.error
    assert record.released_bytes == plan.model.bytes
    assert "fastsafetensors" in record.note and "loader closed" in record.release_note
