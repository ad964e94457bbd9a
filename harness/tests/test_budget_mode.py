"""Budget mode end to end: a scenario swept in real memory cgroups, its record, its report, its refusals.

The sweep tests stand a small Python command in for each strategy's worker (the
``command`` hook): it allocates a known amount of anonymous memory, so the smallest
limit is known and each attempt takes a fraction of a second. Each stays under 300 MiB.
Skipped, with the reason, where no memory cgroup is writable.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from harness.budget.controller import CgroupUnavailable, MemoryController
from harness.budget.mode import BudgetUnavailable, groups_of_this_process, run_budget
from harness.budget.record import BUDGET_FILE, BUDGET_VERSION, read_budget
from harness.cli import main
from harness.report.budget import budget_goals, render_budget
from harness.results.publish import staging_dir
from harness.results.record import RecordError
from harness.run import WorkerCommand
from harness.scenario import BuildConfig, CheckpointConfig, ModelConfig, RunConfig, Scenario
from harness.stopping import RunInterrupted
from harness.units import GIB, MIB

NEEDS = {"map": 96, "load": 160}  # MiB each stand-in allocates

ALLOCATE = (
    "import sys\n"
    "b = bytearray(int(sys.argv[1]) << 20)\n"
    "b[::4096] = b'\\x01' * (len(b) // 4096)\n"  # touch every page: anonymous, resident
)


def scenario(tmp: Path, *strategies: str) -> Scenario:
    return Scenario(
        name="tiny",
        strategies=strategies,
        model=ModelConfig(source="synthetic", layers=1, width=64, heads=4, vocab=64),
        checkpoint=CheckpointConfig(path=tmp / "tiny.safetensors", seed=1, generate=True),
        build=BuildConfig(engines=1, device="cpu"),
        run=RunConfig(memory_limit_gib=1.0, timeout_s=60),
    )


def stand_in(plan: Path, strategy: str, out: Path) -> list[str]:
    return [sys.executable, "-c", ALLOCATE, str(NEEDS[strategy])]


@pytest.fixture(scope="module")
def swept(controller: MemoryController, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    tmp = tmp_path_factory.mktemp("budget")
    record = run_budget(scenario(tmp, "map", "load"), results=tmp / "results", precision_bytes=16 * MIB,
                        command=stand_in, workdir=tmp / "engines", controller=controller, min_timeout_s=30,
                        progress=lambda line: None)
    render_budget(tmp / "results" / "tiny-budget")  # what python -m harness budget does after the sweep
    return tmp / "results" / "tiny-budget", record


def test_each_strategy_gets_the_smallest_limit_it_completes_under(swept) -> None:
    out, record = swept
    for name, needs in NEEDS.items():
        s = record.strategies[name]
        assert s.ok, s.error
        assert not s.at_lower_bound
        # the command needs its allocation plus the interpreter (some MiB); bisection stops within 16 MiB
        assert needs * MIB < s.minimum_bytes < (needs + 64) * MIB
        assert s.largest_failing_bytes is not None
        assert 0 < s.minimum_bytes - s.largest_failing_bytes <= 16 * MIB
        assert s.attempts[0].phase == "unconstrained" and s.attempts[0].limit_bytes == GIB
        assert s.upper_bytes <= s.attempts[0].group_peak_bytes + 2 * MIB, "upper bound: the unconstrained peak"
        for a in s.attempts:
            assert a.completed == (a.limit_bytes >= s.minimum_bytes), a


def test_killed_attempts_are_failures_with_the_oom_kill_as_reason(swept) -> None:
    _, record = swept
    failed = [a for s in record.strategies.values() for a in s.attempts if not a.completed]
    assert failed
    for a in failed:
        assert a.oom_kills and a.oom_kills >= 1
        assert "OOM-killed by the kernel" in (a.reason or "")
    assert all(a.reason is None for s in record.strategies.values() for a in s.attempts if a.completed)


def test_no_group_is_left_behind(swept, controller: MemoryController) -> None:
    _, record = swept
    assert all(a.groups_left == 0 for s in record.strategies.values() for a in s.attempts)
    assert groups_of_this_process(controller) == []


def test_only_map_gets_extra_points_on_its_curve(swept) -> None:
    _, record = swept
    extra = {name: [a.limit_bytes for a in s.attempts if a.phase == "extra"] for name, s in record.strategies.items()}
    assert extra["load"] == []
    m = record.strategies["map"]
    expected = sorted({math.ceil(m.minimum_bytes * f / MIB) * MIB for f in (1.25, 1.5, 2.0)})
    assert extra["map"] == [limit for limit in expected if limit < m.upper_bytes]


def test_a_compilers_map_is_swept_without_extra_points(controller: MemoryController, tmp_path: Path) -> None:
    compiled = replace(scenario(tmp_path, "map"), build=BuildConfig(engines=1, device="cpu", backend="inductor"))
    record = run_budget(compiled, results=tmp_path / "results", precision_bytes=16 * MIB, command=stand_in,
                        workdir=tmp_path / "engines", controller=controller, min_timeout_s=30,
                        progress=lambda line: None)
    phases = [a.phase for a in record.strategies["map"].attempts]
    assert phases[0] == "unconstrained" and "extra" not in phases and len(phases) > 2  # swept, no curve


def test_without_a_run_at_the_goals_limit_its_timing_is_judged_at_the_nearest_limit_under_it(swept) -> None:
    _, record = swept
    m = record.strategies["map"]
    # as a compiler's sweep has them (no extra points), with the load + build a real worker reports
    attempts = tuple(replace(a, load_build_s=0.9 * a.wall_s) if a.completed else a
                     for a in m.attempts if a.phase != "extra")
    nearest = max(a.limit_bytes for a in attempts if a.completed and a.phase != "unconstrained")
    # a baseline that puts the goal's limit just above the largest swept limit that completed
    swept_only = replace(record, strategies={**record.strategies, "map": replace(
        m, attempts=attempts, baseline_rss_bytes=nearest + 2 * MIB)})
    goal_limit = swept_only.goal_limit_bytes("map")
    assert goal_limit is not None and goal_limit > nearest
    under = [a.limit_bytes for a in swept_only.strategies["map"].attempts
             if a.completed and a.limit_bytes <= goal_limit]
    assert under and goal_limit not in under
    (timing,) = [g for g in budget_goals(swept_only) if g.goal.startswith("map's load + build at the goal limit")]
    assert timing.met is not None, timing.measured
    assert timing.measured.startswith(f"at {max(under) / GIB:.3f} GiB, the nearest completed limit under it: ")


def test_the_record_reads_back_as_written_and_the_report_shows_it(swept) -> None:
    out, record = swept
    assert read_budget(out) == record
    assert (out / "attempts.csv").read_text().count("\n") == 1 + sum(len(s.attempts)
                                                                     for s in record.strategies.values())
    report = (out.parent / "tiny-budget.md").read_text()
    assert "## Smallest host memory to compile" in report
    for name, s in record.strategies.items():
        assert f"{s.minimum_bytes / GIB:.3f} GiB" in report, name
    assert (out.parent / "tiny-budget.wall.png").stat().st_size > 10_000
    goals = {g.goal.split(" (")[0]: g for g in budget_goals(record)}
    assert goals["no memory cgroup left behind by any attempt"].met is True


def test_the_record_is_read_strictly(swept, tmp_path: Path) -> None:
    out, _ = swept
    data = json.loads((out / BUDGET_FILE).read_text())
    for change, message in (
        (lambda d: d.update(budget=BUDGET_VERSION + 1), "budget: this harness reads budget records of versions 1 to "),
        (lambda d: d.update(budget=0), "budget: this harness reads budget records of versions 1 to "),
        (lambda d: d.update(extra=1), "unknown key 'extra'"),
        (lambda d: d["strategies"]["map"]["attempts"][0].update(wall_s="slow"),
         r"strategies.map.attempts\[0\].wall_s: expected a number"),
        (lambda d: d["strategies"]["load"].pop("minimum_bytes"), "strategies.load: missing key 'minimum_bytes'"),
    ):
        broken = json.loads(json.dumps(data))
        change(broken)
        (tmp_path / BUDGET_FILE).write_text(json.dumps(broken))
        with pytest.raises(RecordError, match=message):
            read_budget(tmp_path)


def test_plot_rerenders_a_budget_directory(swept, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = swept
    assert main(["plot", str(out), "--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"tiny-budget.wall.png", "tiny-budget.md"}
    assert render_budget(out, tmp_path)[1].read_text() == (tmp_path / "tiny-budget.md").read_text()


def test_without_a_usable_cgroup_budget_mode_refuses_before_writing(tmp_path: Path) -> None:
    not_a_cgroup = MemoryController(1, tmp_path / "cg", tmp_path / "cg")
    not_a_cgroup.parent.mkdir()
    with pytest.raises(BudgetUnavailable, match="budget mode needs a writable memory cgroup: .* is not a memory "
                                                 "cgroup.*refuses to run"):
        run_budget(scenario(tmp_path, "map"), results=tmp_path / "results", controller=not_a_cgroup,
                   command=stand_in)
    assert not (tmp_path / "results").exists()
    assert list(not_a_cgroup.parent.iterdir()) == [], "the probe group is removed"


def test_the_cli_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.budget.mode as mode

    def unavailable(proc: Path = Path("/proc/self")) -> MemoryController:
        raise CgroupUnavailable("budget mode needs a writable memory cgroup: no memory controller is mounted")

    monkeypatch.setattr(mode, "find_controller", unavailable)
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\n[model]\nsource = "synthetic"\nlayers = 1\nwidth = 64\nheads = 4\nvocab = 64\n'
                    '[build]\nengines = 1\n')
    assert main(["budget", str(path), "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: budget mode needs a writable memory cgroup: no memory controller is mounted; "
                   "budget mode refuses to run without one"]
    assert not (tmp_path / "r").exists()
    assert os.path.exists(path)


def test_a_strategy_that_never_completes_is_recorded_as_failed(controller: MemoryController, tmp_path: Path) -> None:
    def broken(plan: Path, strategy: str, out: Path) -> list[str]:
        return [sys.executable, "-c", "import sys; sys.exit('no weights here')"]

    record = run_budget(replace(scenario(tmp_path, "map")), results=tmp_path / "results", command=broken,
                        workdir=tmp_path / "engines", controller=controller, progress=lambda line: None)
    s = record.strategies["map"]
    assert not s.ok and s.minimum_bytes is None
    assert "does not complete under the unconstrained limit" in (s.error or "")
    assert "no weights here" in (s.error or "")
    assert len(s.attempts) == 1 and s.attempts[0].returncode == 1


def test_only_the_unconstrained_run_checks_the_build(controller: MemoryController, tmp_path: Path) -> None:
    log = tmp_path / "argv.log"

    def logging(plan: Path, strategy: str, out: Path) -> list[str]:
        note = f"import sys\nwith open({str(log)!r}, 'a') as f:\n    f.write(repr(sys.argv[2:]) + '\\n')\n"
        return [sys.executable, "-c", note + ALLOCATE, str(NEEDS[strategy])]  # noted before it can be killed

    record = run_budget(scenario(tmp_path, "map"), results=tmp_path / "results", precision_bytes=16 * MIB,
                        command=logging, workdir=tmp_path / "engines", controller=controller, min_timeout_s=30,
                        progress=lambda line: None)
    phases = [a.phase for a in record.strategies["map"].attempts]
    lines = log.read_text().splitlines()
    assert len(lines) == len(phases) > 2
    # the first attempt (unconstrained) checks the built model; the constrained ones only build it
    assert [line == "['--no-check']" for line in lines] == [p != "unconstrained" for p in phases]
    assert phases[0] == "unconstrained"


def test_a_strategy_run_at_one_limit_is_not_swept(controller: MemoryController, tmp_path: Path) -> None:
    record = run_budget(scenario(tmp_path, "map", "load"), results=tmp_path / "results", precision_bytes=16 * MIB,
                        command=stand_in, workdir=tmp_path / "engines", controller=controller, min_timeout_s=30,
                        at={"map": 256 * MIB, "load": 96 * MIB}, progress=lambda line: None)
    for name, completes in (("map", True), ("load", False)):  # map needs 96 MiB, load 160 MiB
        s = record.strategies[name]
        assert s.status == "at_limit" and s.ok and s.minimum_bytes is None
        assert [a.phase for a in s.attempts] == ["unconstrained", "at"]
        assert s.at_limit is not None and s.at_limit.completed is completes
    render_budget(tmp_path / "results" / "tiny-budget")
    report = (tmp_path / "results" / "tiny-budget.md").read_text()
    assert "≤ 0.250 GiB (one run at it, not swept)" in report and "> 0.094 GiB (one run at it, not swept)" in report
    assert read_budget(tmp_path / "results" / "tiny-budget") == record
    with pytest.raises(ValueError, match="at: 'stream' is not a strategy of scenario 'tiny'"):
        run_budget(scenario(tmp_path, "map"), results=tmp_path / "results", command=stand_in,
                   controller=controller, at={"stream": 256 * MIB})


@pytest.mark.parametrize(("given", "message"), [
    ("map", "--at map: expected STRATEGY=GIB (GIB: expected a number >= 0.0009765625 and <= 1048576 "
            "(GiB, 1 MiB to 1 PiB))"),
    ("map=nan", "--at map=nan: expected STRATEGY=GIB"),
    ("=2", "--at =2: expected STRATEGY=GIB"),
    ("stream=2", "--at stream: not a strategy of"),
])
def test_the_cli_refuses_a_bad_at_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str,
                                              message: str) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text('name = "tiny"\nstrategies = ["map"]\n[model]\nsource = "synthetic"\nlayers = 1\nwidth = 64\n'
                    'heads = 4\nvocab = 64\n[build]\nengines = 1\n', encoding="utf-8")
    assert main(["budget", str(path), "--results", str(tmp_path / "results"), "--at", given]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(("enclosing_mib", "completes"), [(384, True), (128, False)])
def test_the_unconstrained_run_gets_no_more_than_the_groups_above_allow(controller: MemoryController, tmp_path: Path,
                                                                       enclosing_mib: int, completes: bool) -> None:
    from harness.tests.test_budget_cgroup import _enclosing

    with _enclosing(controller, enclosing_mib * MIB) as inside:
        record = run_budget(scenario(tmp_path, "load"), results=tmp_path / "results", command=stand_in,
                            workdir=tmp_path / "engines", controller=inside, min_timeout_s=30,
                            at={"load": 256 * MIB}, progress=lambda line: None)
    # the scenario asks for 1 GiB; the group the sweep runs in allows less, and says whose limit it is
    assert record.unconstrained_limit_bytes == enclosing_mib * MIB
    file = "memory.limit_in_bytes" if controller.version == 1 else "memory.max"
    assert record.controller.endswith(f"; unconstrained limit: the {enclosing_mib} MiB limit of the enclosing memory "
                                      f"cgroup {inside.parent} ({file}), below the scenario's run.memory_limit_gib "
                                      "of 1.00 GiB")
    load = record.strategies["load"]  # needs 160 MiB
    assert load.attempts[0].limit_bytes == enclosing_mib * MIB and load.attempts[0].completed is completes
    if not completes:
        assert load.error is not None and load.error.startswith(
            "does not complete under the unconstrained limit of 128 MiB: OOM-killed by the kernel")


BUILDS_ENGINES = """
import json, os, signal, sys, time
from pathlib import Path
plan, strategy, log, needs, stop = json.loads(Path(sys.argv[1]).read_text()), sys.argv[2], sys.argv[3], sys.argv[4], \\
    int(sys.argv[5])
engines = Path(plan["workdir"]).absolute() / f"{plan['name']}-{strategy}"  # where the worker builds: a relative
# workdir is the plan's, relative to the directory the sweep runs in (harness.fileio.paths)
engines.mkdir(parents=True, exist_ok=True)
(engines / "engine-000.safetensors").write_bytes(b"an engine")  # left there, as by a worker killed mid-build
with open(log, "a") as f:
    f.write(f"{engines}\\n")
if stop:  # the sweep is interrupted while this attempt runs
    os.kill(stop, signal.SIGTERM)
    time.sleep(60)
sys.argv[1:] = [needs]
""" + ALLOCATE


def builds_engines(log: Path, stop_in: str = "") -> WorkerCommand:
    """A stand-in that builds an engine file where a worker would and leaves it; in strategy ``stop_in`` it sends
    SIGTERM to this process."""
    def command(plan: Path, strategy: str, out: Path) -> list[str]:
        stop = os.getpid() if strategy == stop_in else 0
        return [sys.executable, "-c", BUILDS_ENGINES, str(plan), strategy, str(log), str(NEEDS[strategy]), str(stop)]
    return command


def test_two_sweeps_of_one_name_build_their_engines_apart_and_leave_none(
    controller: MemoryController, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where engines went by default: data/engines under the current directory
    built: dict[str, list[str]] = {}
    for root in ("a", "b"):
        log = tmp_path / f"{root}.log"
        record = run_budget(scenario(tmp_path, "map"), results=tmp_path / root, command=builds_engines(log),
                            controller=controller, min_timeout_s=30, at={"map": 256 * MIB},
                            progress=lambda line: None)
        assert record.strategies["map"].at_limit is not None and record.strategies["map"].at_limit.completed
        built[root] = log.read_text().splitlines()
        assert len(built[root]) == 2  # the unconstrained attempt and the one at the limit
    assert not set(built["a"]) & set(built["b"]), built
    for root, directories in built.items():
        assert all(Path(d).is_relative_to(staging_dir(tmp_path / root, "tiny-budget")) for d in directories), built
    assert not list(tmp_path.rglob("engine-*")), "no attempt leaves an engine behind"
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["tiny-budget"]


def test_an_interrupted_sweep_leaves_no_engine_behind(controller: MemoryController, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "results"
    with pytest.raises(RunInterrupted, match="interrupted by SIGTERM.*kept .* for its finished strategies map"):
        run_budget(scenario(tmp_path, "map", "load"), results=results, command=builds_engines(tmp_path / "log", "load"),
                   controller=controller, min_timeout_s=30, at={"map": 256 * MIB}, progress=lambda line: None)
    built = (tmp_path / "log").read_text().splitlines()
    assert [Path(d).name for d in built] == ["tiny-budget-map", "tiny-budget-map", "tiny-budget-load"]
    assert not list(tmp_path.rglob("engine-*")), "the engine load's attempt was building is gone"
    assert staging_dir(results, "tiny-budget").is_dir(), "kept for map, without engines"


def test_a_signal_once_publishing_began_leaves_the_sweep_published(controller: MemoryController, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.budget.mode

    real = harness.budget.mode.publish

    def signalled_while_publishing(staging: Path, out: Path) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        real(staging, out)

    monkeypatch.setattr(harness.budget.mode, "publish", signalled_while_publishing)
    results = tmp_path / "results"
    record = run_budget(scenario(tmp_path, "map"), results=results, command=stand_in, workdir=tmp_path / "engines",
                        controller=controller, min_timeout_s=30, at={"map": 256 * MIB}, progress=lambda line: None)
    assert read_budget(results / "tiny-budget") == record, "published, not said to be unchanged"
    assert not staging_dir(results, "tiny-budget").exists()


SIBLING = """
import json, sys
from pathlib import Path
plan = json.loads(Path(sys.argv[1]).read_text())
if not (Path(plan["workdir"]).absolute() / "other-strategy" / "engine-000.safetensors").exists():
    sys.exit("another strategy's engine was removed")
"""


def test_an_attempts_cleanup_leaves_the_engines_another_strategy_builds_beside_it(
    controller: MemoryController, tmp_path: Path
) -> None:
    other = tmp_path / "engines" / "other-strategy"  # as another strategy's attempt builds at the same time
    other.mkdir(parents=True)
    (other / "engine-000.safetensors").write_bytes(b"an engine")
    record = run_budget(scenario(tmp_path, "map"), results=tmp_path / "results",
                        command=lambda plan, strategy, out: [sys.executable, "-c", SIBLING, str(plan)],
                        workdir=tmp_path / "engines", controller=controller, min_timeout_s=30, at={"map": 256 * MIB},
                        progress=lambda line: None)
    at = record.strategies["map"].at_limit
    assert at is not None and at.completed, at


class _FakeStrategy:
    """Attempts of one strategy without processes: each completes at and above ``threshold``; the unconstrained
    run's worker reports a baseline of ``rss`` bytes, ``anon`` of them anonymous."""

    def __init__(self, strategy: str, threshold: int, rss: int, anon: int) -> None:
        from types import SimpleNamespace

        self.strategy, self.threshold, self.timeout_s = strategy, threshold, 60.0
        self.worker = SimpleNamespace(release_note="", baseline_rss_bytes=rss)
        self.anon = anon
        self.runs: list[tuple[object, object, int | None, int]] = []
        self.limits: list[int] = []

    def attempt(self, limit: int, phase: str = "") -> object:
        from harness.budget.cgroup import Attempt

        ok = limit >= self.threshold
        result = Attempt(limit_bytes=limit, completed=ok, returncode=0 if ok else -9, wall_s=1.0,
                         group_peak_bytes=min(limit, 400 * MIB), oom_kills=0 if ok else 1,
                         reason=None if ok else "OOM-killed")
        self.runs.append((result, self.worker, self.anon, 0))
        self.limits.append(limit)
        return result

    def records(self, phases: object) -> tuple[()]:
        return ()

    def say(self, message: str) -> None:
        pass


def test_a_sweep_starts_from_the_minimum_the_rules_predict_from_the_plan_and_its_baseline() -> None:
    """The attempt after the upper bound is at the predicted minimum: for ``map`` its baseline's anonymous
    memory plus the reclaim floor (its rule), whatever the engines; the same minimum as the sweep finds without it."""
    from types import SimpleNamespace
    from typing import Any

    from harness.budget.mode import _sweep_strategy
    from harness.predict.recorded import predicted_minimum
    from harness.predict.rules import RECLAIM_FLOOR_BYTES

    engines = (SimpleNamespace(weight_bytes=30 * MIB), SimpleNamespace(weight_bytes=20 * MIB))
    plan: Any = SimpleNamespace(
        name="t", compiler=False, largest_engine_bytes=30 * MIB, device="cpu", engines=engines,
        model=SimpleNamespace(bytes=50 * MIB), scenario=SimpleNamespace(build=SimpleNamespace(
            backend="copy", compiler_weights=None)))
    anon = 200 * MIB
    runner: Any = _FakeStrategy("map", threshold=anon + 40 * MIB, rss=290 * MIB, anon=anon)
    swept = _sweep_strategy(runner, plan, GIB, 64 * MIB, 3.0, 30.0, predicted_minimum)
    predicted = anon + RECLAIM_FLOOR_BYTES
    assert runner.limits[:3] == [GIB, 401 * MIB, math.ceil(predicted / MIB) * MIB]  # unconstrained, upper, start
    assert swept.minimum_bytes is not None and swept.largest_failing_bytes is not None
    assert swept.largest_failing_bytes < runner.threshold <= swept.minimum_bytes
