"""The copy builder's staged copies on a thread of their own (the GPU path, driven on the CPU): engine k's copy
runs while engine k+1's pages come in, k is released only once its copy is finished, one engine is in flight at
a time, a failed copy fails the build naming the engine and the tensor, and nothing is left running."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import harness.engines.copy as copy_module
from harness.backends import BACKENDS
from harness.engines.builder import BuildTarget, EngineBuilder
from harness.engines.copy import CopyToDevice, fault_in
from harness.engines.staging import Copier, CopyFailed, HostRing, StagedPair
from harness.load.strategies import StreamHooks
from harness.plan import Plan, make_plan
from harness.results.samples import read_events
from harness.scenario import load_scenario
from harness.tests.tiny_scenario import tiny_scenario_text
from harness.units import GIB
from harness.worker import measure
from weightmap import ReleasePlan, release_storage

CHUNK = 64  # bytes: every tensor below takes several chunks


class Recording(HostRing):
    """A host ring that logs every copy (by the source's address), wait and drain into ``log``; ``gate``, where
    given, holds each copy until it is set; ``fail_at`` makes that copy (counted from 0) raise."""

    def __init__(self, log: list[Any], gate: threading.Event | None = None, fail_at: int | None = None) -> None:
        super().__init__(slots=2, chunk_bytes=CHUNK)
        self.log, self.gate, self.fail_at, self.copies = log, gate, fail_at, 0
        self.entered = threading.Event()

    def copy(self, slot: int, source: torch.Tensor, destination: torch.Tensor) -> None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        if self.copies == self.fail_at:
            raise OSError("the device refused the copy")
        self.copies += 1
        super().copy(slot, source, destination)
        self.log.append(("copy", source.data_ptr()))

    def drain(self) -> None:
        self.log.append(("drain",))


def _engines(count: int = 3) -> list[dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    return [{f"e{k}.w": torch.randn(7, 13), f"e{k}.b": torch.randn(5).to(torch.bfloat16),
             f"e{k}.t": torch.randn(6, 4).t()}  # non-contiguous: copied on the building thread
            for k in range(count)]


def _owner(engines: list[dict[str, torch.Tensor]]) -> Callable[[int], int]:
    """The engine whose source tensor holds a byte address."""
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), k)
             for k, e in enumerate(engines) for t in e.values()]
    return lambda address: next(k for lo, hi, k in spans if lo <= address < hi)


def _copier_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "engine-copier"]


def test_each_engine_is_done_after_its_copy_and_the_next_starts_after_it() -> None:
    log: list[Any] = []
    engines = _engines()
    builder = CopyToDevice(device="cpu", staging=lambda device: Recording(log))
    built = [builder.build(k, tensors, lambda i: log.append(("done", i))) for k, tensors in enumerate(engines)]
    builder.finish(lambda i: log.append(("done", i)))
    owner = _owner(engines)
    steps = [("copy", owner(e[1])) if e[0] == "copy" else e for e in log]
    assert [s for s in steps if s[0] == "done"] == [("done", 0), ("done", 1), ("done", 2)]
    for k in range(3):
        done = steps.index(("done", k))
        copies = [i for i, s in enumerate(steps) if s == ("copy", k)]
        assert copies and max(copies) < done, f"engine {k} reported done before its last chunk was copied"
        assert ("drain",) in steps[max(copies):done], f"engine {k} reported done before the stager drained"
        if k:  # one engine in flight: k's copy starts after k - 1 is done
            assert min(copies) > steps.index(("done", k - 1))
    # the contiguous tensors went through the ring (in several chunks each), the transposed one did not
    assert sum(1 for s in steps if s[0] == "copy") == sum(-(-t.numel() * t.element_size() // CHUNK)
                                                         for e in engines for t in e.values() if t.is_contiguous())
    for source, made in zip(engines, builder.engines, strict=True):  # bit-exact, dtype and shape kept
        assert made.keys() == source.keys()
        for name, t in source.items():
            assert made[name].dtype == t.dtype and made[name].shape == t.shape and torch.equal(made[name], t), name
    assert [b.nbytes for b in built] == [copy_module.packed_layout(e)[1] for e in engines]
    builder.close()
    assert not _copier_threads()


def test_an_engine_being_copied_is_not_done_until_its_copy_finishes() -> None:
    log: list[Any] = []
    gate = threading.Event()
    builder = CopyToDevice(device="cpu", staging=lambda device: Recording(log, gate))
    done: list[int] = []
    builder.build(0, _engines(1)[0], done.append)
    assert builder.copier is not None and builder.copier.in_flight == 0
    assert builder.copier.poll() is None and done == []  # its copy is held: not done, not released
    gate.set()
    builder.finish(done.append)
    assert done == [0] and builder.copier.in_flight is None
    builder.close()
    assert not _copier_threads()


def test_a_finished_copy_is_released_while_the_next_engines_pages_come_in(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[Any] = []
    real = fault_in

    def logged(tensors: Any, between: Callable[[], None] | None = None, chunk_bytes: int = 0) -> int:
        log.append("pages in")
        touched = real(tensors, between, chunk_bytes=4096)  # one page a chunk: several chances to take it back
        log.append("pages done")
        return touched

    monkeypatch.setattr(copy_module, "fault_in", logged)
    engines = [{"w": torch.randn(64, 1024)}, {"w": torch.randn(64, 1024)}]
    builder = CopyToDevice(device="cpu", staging=lambda device: Recording([]), overlap_bytes=GIB)
    builder.build(0, engines[0], lambda i: log.append(("done", i)))
    assert builder.copier is not None and builder.copier.copied()  # engine 0 copied, not yet taken back
    builder.build(1, engines[1], lambda i: log.append(("done", i)))
    assert log[:4] == ["pages in", "pages done", "pages in", ("done", 0)]  # during engine 1's pages, not after
    builder.close()


def test_by_default_no_page_of_the_next_engine_comes_in_beside_one_being_copied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[Any] = []
    real = fault_in

    def logged(tensors: Any, between: Callable[[], None] | None = None, chunk_bytes: int = 0) -> int:
        log.append("pages in")
        return real(tensors, between, chunk_bytes=4096)

    monkeypatch.setattr(copy_module, "fault_in", logged)
    gate = threading.Event()
    builder = CopyToDevice(device="cpu", staging=lambda device: Recording([], gate))
    builder.build(0, {"w": torch.randn(64, 1024)}, lambda i: log.append(("done", i)))
    gate.set()
    builder.build(1, {"w": torch.randn(64, 1024)}, lambda i: log.append(("done", i)))
    assert log[:3] == ["pages in", ("done", 0), "pages in"]  # engine 0 copied and released before engine 1's pages
    builder.close()


def test_the_overlap_waits_for_the_copy_once_its_bytes_are_in(monkeypatch: pytest.MonkeyPatch) -> None:
    chunks: list[int] = []
    waiting = threading.Event()
    real_fault_in = fault_in

    def counted(tensors: Any, between: Callable[[], None] | None = None, chunk_bytes: int = 0) -> int:
        def each() -> None:
            chunks.append(1)
            if between is not None:
                between()
        return real_fault_in(tensors, each, chunk_bytes=copy_module.FAULT_CHUNK_BYTES)

    monkeypatch.setattr(copy_module, "fault_in", counted)
    gate = threading.Event()
    builder = CopyToDevice(device="cpu", staging=lambda device: Recording([], gate),
                           overlap_bytes=2 * copy_module.FAULT_CHUNK_BYTES)
    done: list[int] = []
    builder.build(0, {"w": torch.randn(64, 1024)}, done.append)
    chunks.clear()  # engine 0's own
    real_finish = builder.finish

    def finish(report: Callable[[int], None]) -> None:
        waiting.set()
        real_finish(report)

    monkeypatch.setattr(builder, "finish", finish)
    large = torch.zeros(6 * copy_module.FAULT_CHUNK_BYTES // 4)  # six chunks of pages
    worker = threading.Thread(target=builder.build, args=(1, {"w": large}, done.append), daemon=True)
    worker.start()
    assert waiting.wait(60)  # it waits for engine 0's copy ...
    assert (len(chunks), done) == (3, [])  # ... once a chunk beyond the two allowed is in, and not before
    gate.set()
    worker.join(60)
    assert not worker.is_alive() and done[:1] == [0]
    builder.close()


def test_a_copied_engine_is_reported_done_holding_no_view_of_its_sources() -> None:
    # a view held by the copier would keep the weight's storage from being resized (and a file's pages mapped)
    weights = [torch.randn(40), torch.randn(24)]
    copier = Copier(Recording([]), "cpu")
    destinations = [torch.empty(w.numel() * w.element_size(), dtype=torch.uint8) for w in weights]
    pairs = zip(weights, destinations, strict=True)
    copier.submit(0, [StagedPair(f"w{i}", w.view(torch.uint8), d) for i, (w, d) in enumerate(pairs)])
    del pairs
    assert copier.wait() == 0
    try:
        assert all(torch.equal(d.view(torch.float32), w) for w, d in zip(weights, destinations, strict=True))
        assert all(release_storage(w, resize=True) for w in weights)
        assert all(w.untyped_storage().nbytes() == 0 for w in weights)
    finally:
        copier.close()


def test_a_failed_copy_fails_the_next_build_naming_engine_and_tensor() -> None:
    log: list[Any] = []
    builder = CopyToDevice(device="cpu", staging=lambda device: Recording(log, fail_at=2))
    done: list[int] = []
    builder.build(0, {"first": torch.randn(16), "second": torch.randn(64)}, done.append)
    with pytest.raises(CopyFailed, match=r"^engine 0: the staged copy to cpu failed: tensor 'second': "
                                         r"the device refused the copy$"):
        builder.build(1, {"third": torch.randn(16)}, done.append)
    assert done == [] and ("drain",) in log  # never released; the stager drained all the same
    builder.close()
    assert not _copier_threads()


def test_closing_stops_a_copy_in_flight_and_leaves_no_thread() -> None:
    log: list[Any] = []
    gate = threading.Event()
    source = torch.randn(256)  # 16 chunks
    stager = Recording(log, gate)
    copier = Copier(stager, "cpu")
    copier.submit(0, [StagedPair("w", source.view(torch.uint8), torch.empty(1024, dtype=torch.uint8))])
    with pytest.raises(RuntimeError, match="engine 1 submitted while engine 0 is still in flight"):
        copier.submit(1, [])
    stager.entered.wait()  # the first chunk is being copied, held at the gate
    closing = threading.Thread(target=copier.close)
    closing.start()
    while not copier.closed:
        closing.join(0.01)
    gate.set()  # the held chunk ends; the next one sees the copier closed
    closing.join()
    assert not _copier_threads()
    assert [e[0] for e in log] == ["copy", "drain"]
    copier.close()  # again: nothing to do
    with pytest.raises(RuntimeError, match="closed"):
        copier.submit(2, [])


def test_fault_in_touches_every_page_once_whatever_its_chunks() -> None:
    t = torch.randn(300_000)
    calls: list[int] = []
    whole = fault_in([t])
    assert fault_in([t], between=lambda: calls.append(1), chunk_bytes=8192) == whole
    assert len(calls) >= t.numel() * 4 // 8192


# ------------------------------------------------------------------ through the worker


STAGED: list[Any] = []
"""What the staged builders of the worker's tests logged: copies by source address, releases."""
FAIL_AT: list[int | None] = [None]


def make_staged(plan: BuildTarget, workdir: Path) -> EngineBuilder:
    """The copy backend's GPU builder on the CPU, its copies logged (a spec names it)."""
    return CopyToDevice(device="cpu", staging=lambda device: Recording(STAGED, fail_at=FAIL_AT[0]))


@pytest.fixture
def staged(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(BACKENDS, "copy", dataclasses.replace(BACKENDS["copy"], factory=f"{__name__}:make_staged"))
    real = ReleasePlan.built

    def built(self: ReleasePlan, index: int) -> Any:
        STAGED.append(("release", index))
        return real(self, index)

    monkeypatch.setattr(ReleasePlan, "built", built)
    real_submit = Copier.submit

    def submit(self: Copier, index: int, pairs: Any) -> None:
        STAGED.append(("submit", index))
        real_submit(self, index, pairs)

    monkeypatch.setattr(Copier, "submit", submit)
    real_before = StreamHooks.before

    def before(self: StreamHooks, index: int, names: Any) -> None:
        STAGED.append(("hook brings in", index))
        real_before(self, index, names)

    monkeypatch.setattr(StreamHooks, "before", before)
    STAGED.clear()
    yield
    STAGED.clear()
    FAIL_AT[0] = None


@pytest.fixture
def plan(tmp_path: Path) -> Plan:
    path = tmp_path / "s.toml"
    path.write_text(tiny_scenario_text(tmp_path / "c.safetensors", {"engines = 2": "engines = 3"}))
    return make_plan(load_scenario(path), name="t", workdir=tmp_path / "engines")


@pytest.mark.parametrize("strategy", ["map", "load", "stream"])  # mapped pages, resized storages, hooks
def test_the_worker_releases_each_engine_once_its_copy_is_finished(plan: Plan, tmp_path: Path, staged: None,
                                                                  strategy: str) -> None:
    record = measure(plan, strategy, tmp_path / "out", check=False)
    assert record.ok, record.error
    turns = [e for e in STAGED if e[0] in ("submit", "release", "hook brings in")]
    steps = ("hook brings in", "submit", "release") if strategy == "stream" else ("submit", "release")
    assert turns == [(step, e.index) for e in plan.engines for step in steps]  # a hook's engine after the last
    for engine in plan.engines:  # the stager drained after the engine's last chunk and before its release
        release = STAGED.index(("release", engine.index))
        last_copy = max(i for i, e in enumerate(STAGED[:release]) if e[0] == "copy")
        assert ("drain",) in STAGED[last_copy:release]
    # every engine's record holds what its release measured, whenever it came, and the totals are whole
    assert all(e.released_bytes is not None and e.rss_after_bytes is not None for e in record.engines)
    assert record.released_bytes == sum(e.released_bytes or 0 for e in record.engines)
    assert record.released_bytes >= plan.model.bytes  # every weight, mapped pages and resized storages alike
    assert all(e.pages_s is not None and e.copy_s is not None for e in record.engines)
    events = read_events(tmp_path / "out" / f"events-{strategy}.csv")
    assert list(events["event"]).count("engine_end") == len(plan.engines)
    assert not _copier_threads()


def test_a_failed_copy_fails_the_strategy_and_leaves_no_thread(plan: Plan, tmp_path: Path, staged: None) -> None:
    FAIL_AT[0] = 0
    record = measure(plan, "map", tmp_path / "out", check=False)
    assert record.status == "failed" and record.error is not None
    assert record.error.startswith("CopyFailed: engine 0: the staged copy to cpu failed: tensor '")
    assert ("release", 0) not in STAGED  # a weight whose copy failed is not released as if copied
    assert not _copier_threads()
