"""What the parent prints about the run as a whole: the overall line before each worker run, and the
bars of the one-off files it writes (a generated checkpoint, a ``.pt`` conversion)."""

from __future__ import annotations

import io
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from tqdm import tqdm

from harness.cli import main
from harness.load.peers import ensure_pt
from harness.models.checkpoints import checkpoint_specs, describe_specs, ensure_checkpoint
from harness.progress import RunCounter, overall_line, run_label
from harness.run_record import planned_runs
from harness.scenario import RunConfig
from harness.tests.tiny_scenario import tiny_scenario_text

STRATEGIES = ("map", "load", "load_file", "torch_mmap", "stream", "map_no_prefetch", "map_keep_cache")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_overall_line_counts_every_worker_run_and_estimates_from_the_runs_done() -> None:
    run = RunConfig(warmup=1, repeats=3)
    total = planned_runs(run, len(STRATEGIES))
    assert total == 28  # 7 strategies x (1 warm-up round + 3 repeats)
    labels = [run_label(s, run.warmup, run.repeats, warmup=0) for s in STRATEGIES]
    labels += [run_label(s, run.warmup, run.repeats, repeat=r) for r in range(3) for s in STRATEGIES]
    assert len(labels) == total
    clock = FakeClock()
    counter = RunCounter(total, clock=clock)
    lines = []
    for label in labels:
        lines.append(counter.next(label))
        clock.now += 45.0  # each run takes 45 s
    assert lines[0] == "run 1 of 28: map, warm-up 1 of 1", "no estimate before a run is done"
    assert lines[1] == "run 2 of 28: load, warm-up 1 of 1 — 1 done in 45 s, about 20 min left"
    # 8 runs done in 6.0 min: 45 s each, 20 runs left (this one included): 15 min
    assert lines[8] == "run 9 of 28: load, repeat 1 of 3 — 8 done in 6.0 min, about 15 min left"
    assert lines[21] == "run 22 of 28: map, repeat 3 of 3 — 21 done in 15.8 min, about 5 min left"
    assert lines[-1] == "run 28 of 28: map_keep_cache, repeat 3 of 3 — 27 done in 20.2 min, about 45 s left"


def test_the_estimate_follows_the_mean_of_the_runs_so_far() -> None:
    assert overall_line(3, 10, "map", 100.0) == "run 3 of 10: map — 2 done in 1.7 min, about 7 min left"  # 50 s x 8
    assert overall_line(3, 10, "map", 10.0) == "run 3 of 10: map — 2 done in 10 s, about 40 s left"
    assert overall_line(1, 10, "map", 0.0) == "run 1 of 10: map"
    assert run_label("map", 0, 1) == "map", "one round: the strategy alone"


RECORDS = """
import sys
from pathlib import Path
from harness.results.record import StrategyRecord, write_strategy_file
write_strategy_file(Path(sys.argv[1]), sys.argv[2], StrategyRecord(status="failed", error="stand-in"))
sys.exit(1)
"""


def test_a_run_numbers_its_worker_runs_as_planned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = tmp_path / "s.toml"
    rounds = '[run]\nwarmup = 1\nrepeats = 2\ncache = "warm"\n'
    scenario.write_text(tiny_scenario_text(tmp_path / "c.safetensors", {
        'strategies = ["map"]': 'strategies = ["map", "load"]'}, extra=rounds))

    def command(plan: Path, strategy: str, out: Path) -> list[str]:
        return [sys.executable, "-c", textwrap.dedent(RECORDS), str(out), strategy]

    monkeypatch.setattr("harness.run.worker_command", command)
    assert main(["run", str(scenario), "--results", str(tmp_path / "results")]) == 1
    runs = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[harness] run ")]
    assert [re.sub(r" — .*", "", line) for line in runs] == [
        "[harness] run 1 of 6: map, warm-up 1 of 1",
        "[harness] run 2 of 6: load, warm-up 1 of 1",
        "[harness] run 3 of 6: map, repeat 1 of 2",
        "[harness] run 4 of 6: load, repeat 1 of 2",
        "[harness] run 5 of 6: load, repeat 2 of 2",  # the order changes from round to round (harness/rounds.py)
        "[harness] run 6 of 6: map, repeat 2 of 2",
    ]
    assert all(re.search(r" — \d+ done in \d+ s, about \d+ s left$", line) for line in runs[1:]), runs


class Recorded(tqdm):  # type: ignore[type-arg]
    """A bar that keeps itself, to be read after it is closed."""

    bars: list[Recorded] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        Recorded.bars.append(self)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorded]:
    Recorded.bars = []
    monkeypatch.setattr("harness.progress.tqdm", Recorded)
    return Recorded.bars


def small_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8))


def test_generating_a_checkpoint_shows_the_bytes_written_on_a_terminal(
    tmp_path: Path, recorded: list[Recorded], monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    ensure_checkpoint(small_model(), tmp_path / "m.safetensors", 7)
    (bar,) = recorded
    nbytes = describe_specs(checkpoint_specs(small_model()))["nbytes"]
    assert bar.n == bar.total == nbytes == (64 * 32 + 32 + 32 * 8 + 8) * 4
    assert "[harness] generating m.safetensors: 100%" in terminal.getvalue()


def test_converting_to_pt_shows_the_bytes_written_on_a_terminal_and_nothing_elsewhere(
    tmp_path: Path, recorded: list[Recorded], monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint, _ = ensure_checkpoint(small_model(), tmp_path / "m.safetensors", 7, progress=False)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    recorded.clear()
    assert ensure_pt(checkpoint, tmp_path / "m.pt")
    (bar,) = recorded
    size = (tmp_path / "m.pt").stat().st_size
    assert bar.n == bar.total == size > (64 * 32 + 32 + 32 * 8 + 8) * 4, "every byte of the file, weights and all"
    shown = tqdm.format_sizeof(size, divisor=1024)
    assert "[harness] converting to m.pt: 100%" in terminal.getvalue()
    assert f"{shown}/{shown}" in terminal.getvalue()
    assert sorted(torch.load(tmp_path / "m.pt", mmap=True, weights_only=True)) == ["0.bias", "0.weight", "1.bias",
                                                                                    "1.weight"]
    log = io.StringIO()  # not a terminal: no bar
    monkeypatch.setattr(sys, "stderr", log)
    (tmp_path / "m.pt").unlink()
    assert ensure_pt(checkpoint, tmp_path / "m.pt")
    assert log.getvalue() == ""
