"""The GPU loader peers used as their authors recommend (:mod:`harness.load.gpu_whole`): each opened once for the
whole checkpoint, each tensor delivered once and dropped after its last engine, the loader closed after the last
engine; run with the fake packages of :mod:`harness.tests.test_gpu_peers` (CPU tensors), and fastsafetensors' own
CPU path where it is installed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.load.gpu_whole import FastSafetensorsWholeHooks, InstantTensorWholeHooks, StPrefetchWholeHooks
from harness.tests.test_gpu_peers import _install_fakes, _model, _plan, _walk
from harness.worker import measure

WHOLE: dict[str, Any] = {"st_prefetch_whole": StPrefetchWholeHooks,
                         "fastsafetensors_whole": FastSafetensorsWholeHooks,
                         "instanttensor_whole": InstantTensorWholeHooks}
OPENS = {"st_prefetch_whole": "prefetch", "fastsafetensors_whole": "parallel", "instanttensor_whole": "instant_open"}
CLOSES = {"st_prefetch_whole": "close", "fastsafetensors_whole": "parallel_close",
          "instanttensor_whole": "instant_close"}


def _last_engines(hooks: Any, partitions: list[list[str]], stored: dict[str, torch.Tensor]) -> dict[str, int]:
    last: dict[str, int] = {}
    for index, names in enumerate(partitions):
        last.update({hooks.stored(n): index for n in names if hooks.stored(n) in stored})
    return last


@pytest.mark.parametrize("name", list(WHOLE))
def test_one_open_for_the_whole_plan_each_tensor_once_dropped_after_its_last_engine(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path, "map", engines=3)
    stored = load_file(str(tmp_path / "c.safetensors"))
    calls: list[tuple[Any, ...]] = []
    log = _install_fakes(monkeypatch, calls)
    model = _model(plan)
    partitions = [list(e.names) for e in plan.engines]
    hooks = WHOLE[name](model, tmp_path / "c.safetensors", "cuda:0", partitions)
    last = _last_engines(hooks, partitions, stored)
    assert max(last.values()) == len(partitions) - 1 and min(last.values()) == 0
    tied = {s for s, index in last.items() if s in {hooks.stored(n) for n in partitions[0]} and index > 0}
    assert tied, "the synthetic model's tied tensor is read by the first engine and a later one"
    assert [c for c in calls if c[0] == OPENS[name]] == [], "nothing opened before the first engine's build"
    dropped_at: dict[int, list[str]] = {}

    def check(index: int) -> None:
        assert len([c for c in calls if c[0] == OPENS[name]]) == 1, "opened once, for every engine"
        assert not any(c[0] == CLOSES[name] for c in calls), "open while engines are built"

    def after_each(index: int) -> None:
        alive = set(log.alive())
        dropped_at[index] = sorted(s for s, end in last.items() if end <= index and s in alive)
        assert {s for s in tied if index < last[s]} <= alive, "a tensor a later engine reads is kept"

    original_after = hooks.after

    def after(index: int, names: Any) -> int:
        released = original_after(index, names)
        after_each(index)
        assert released == sum(stored[s].numel() * stored[s].element_size() for s, end in last.items()
                               if end == index), "an engine releases the tensors it is the last to read"
        return released

    hooks.after = after
    released = _walk(hooks, plan, model, stored, check)
    assert all(not names for names in dropped_at.values()), f"held after their last engine: {dropped_at}"
    assert released == plan.model.bytes, "every stored tensor's bytes count once, at its last engine"
    assert sorted(n for n, _ in log.handed) == sorted(last), "each tensor the engines read delivered once"
    assert log.alive() == [] and hooks.held == {}
    assert calls[-1][0] == CLOSES[name] or (name == "fastsafetensors_whole" and calls[-2:] == [
        ("iterate_close",), ("parallel_close",)]), "closed after the last engine (the iterator before the loader)"
    opened = [c for c in calls if c[0] == OPENS[name]]
    if name == "st_prefetch_whole":
        (prefetch,) = opened
        order = list(dict.fromkeys(hooks.stored(n) for names in partitions for n in names if hooks.stored(n) in last))
        assert prefetch[2] == tuple(order), "the whole plan, in build order"
        assert prefetch[3] == 0 and prefetch[4] == 8, "device ordinal 0, 8 threads"
    elif name == "instanttensor_whole":
        (open_,) = opened
        assert set(open_[3]) == set(last) and open_[2] == "cuda:0"
        assert open_[4] == {}, "its defaults: no buffer size asked for"
    else:
        (open_,) = opened
        assert open_ == ("parallel", (str(tmp_path / "c.safetensors"),), "cuda:0", True, None), \
            "every file, its defaults: no max_batch_bytes"


class _TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.z = torch.nn.Linear(4, 4, bias=False)  # built first, stored last: the writer orders names
        self.a = torch.nn.Linear(4, 4, bias=False)


@pytest.mark.parametrize("name", ["fastsafetensors_whole", "instanttensor_whole"])
def test_a_tensor_delivered_before_its_engine_is_held_until_that_engine_and_dropped_after_it(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = {k: v.detach().clone() for k, v in _TwoLayers().state_dict().items()}
    path = tmp_path / "c.safetensors"
    save_file(state, str(path))
    header = json.loads(path.read_bytes()[8:8 + int.from_bytes(path.read_bytes()[:8], "little")])
    assert header["a.weight"]["data_offsets"][0] == 0, "file order is not build order"
    calls: list[tuple[Any, ...]] = []
    log = _install_fakes(monkeypatch, calls)
    meta = _TwoLayers().to("meta")
    engines = [["z.weight"], ["a.weight"]]
    hooks = WHOLE[name](meta, path, "cuda:0", engines)
    hooks.before(0, engines[0])
    assert [n for n, _ in log.handed] == ["a.weight", "z.weight"], "read on, in file order, to engine 0's tensor"
    assert torch.equal(meta.get_parameter("z.weight"), state["z.weight"])
    assert hooks.after(0, engines[0]) == 16 * 4, "engine 0's tensor released"
    assert set(hooks.held) == {"a.weight"} and log.alive() == ["a.weight"], "engine 1's tensor held, engine 0's gone"
    hooks.before(1, engines[1])
    assert torch.equal(meta.get_parameter("a.weight"), state["a.weight"])
    assert len(log.handed) == 2, "not read again"
    assert hooks.after(1, engines[1]) == 16 * 4
    assert log.alive() == [] and calls[-1][0] == CLOSES[name]


def test_fastsafetensors_whole_builds_on_the_cpu(tmp_path: Path) -> None:
    pytest.importorskip("fastsafetensors")
    plan = _plan(tmp_path, "fastsafetensors_whole", engines=3)
    stored = load_file(str(tmp_path / "c.safetensors"))
    model = _model(plan)
    hooks = FastSafetensorsWholeHooks(model, tmp_path / "c.safetensors", "cpu", [e.names for e in plan.engines])
    assert hooks.nogds
    assert _walk(hooks, plan, model, stored) == plan.model.bytes
    assert hooks.closed and hooks.held == {}
    record = measure(plan, "fastsafetensors_whole", tmp_path / "out")
    assert record.ok, record.error
    assert record.released_bytes == plan.model.bytes
    assert "ParallelLoader over every file" in record.note
    assert "dropped after its last engine" in record.release_note
    assert record.build_peak_bytes is not None and record.engines, "host peak and engines recorded as for the others"


def test_fastsafetensors_per_engine_builds_on_the_cpu_with_buffers_sized_to_each_engine(tmp_path: Path) -> None:
    pytest.importorskip("fastsafetensors")
    plan = _plan(tmp_path, "fastsafetensors", engines=3)
    record = measure(plan, "fastsafetensors", tmp_path / "out")
    assert record.ok, record.error
    assert record.released_bytes == plan.model.bytes
    assert "max_batch_bytes its bytes" in record.note
