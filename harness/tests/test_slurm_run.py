"""A run's workers as Slurm jobs (``run --executor slurm``): against the one-node Slurm the ``slurm`` fixture starts
on this machine (skipped with the reason where it cannot), and what each job state means (a fake client, no Slurm)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.cli import main
from harness.cluster.run_job import WATCHER_ENFORCER
from harness.cluster.runs import SlurmRuns
from harness.cluster.slurm import JobState, SlurmClient
from harness.errors import HarnessError
from harness.results.record import RunRecord
from harness.run import run_scenario
from harness.scenario import Scenario, load_scenario
from harness.scenario_cluster import ClusterSettings
from harness.stopping import RunInterrupted
from harness.tests.slurm_cluster import LocalSlurm
from harness.tests.terminal import terminal_signals  # noqa: F401 (autouse: each test starts from a terminal's signals)
from harness.tests.tiny_scenario import tiny_scenario_text
from harness.units import GIB
from harness.watch import no_result_of_its_own, strategy_record

PY = sys.executable


def _tiny(tmp_path: Path, strategies: str = '["map"]', run: str = "") -> Path:
    file = tmp_path / "tiny.toml"
    text = tiny_scenario_text(tmp_path / "c.safetensors", {'strategies = ["map"]': f"strategies = {strategies}"},
                              f"[run]\nmemory_limit_gib = 2\ntimeout_s = 120\n{run}")
    file.write_text(text)
    return file


def _squeue(client: SlurmClient) -> str:
    return client._run(["squeue", "-h", "-o", "%i %T"]).stdout.strip()


def _nothing_queued(client: SlurmClient) -> str:
    deadline = time.monotonic() + 30
    while _squeue(client) and time.monotonic() < deadline:
        time.sleep(0.3)
    return _squeue(client)


def _sleeper(plan: Path, strategy: str, out: Path) -> list[str]:
    """A worker that never ends on its own (and writes no record)."""
    return [PY, "-c", "import time; time.sleep(300)"]


def _first_job(client: SlurmClient) -> str:
    deadline = time.monotonic() + 60
    while not client.live and time.monotonic() < deadline:
        time.sleep(0.1)
    return client.live[0]


def test_a_run_through_slurm_is_one_job_per_worker_each_named_in_its_record(
    slurm: LocalSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    submitted: list[list[str]] = []
    submit = SlurmClient.submit

    def recording(self: SlurmClient, name: str, script: str, options: Any) -> str:
        submitted.append([name, *options])
        return submit(self, name, script, options)

    monkeypatch.setattr(SlurmClient, "submit", recording)
    results = tmp_path / "results"
    file = _tiny(tmp_path, '["map", "load"]')
    assert main(["run", str(file), "--executor", "slurm", "--results", str(results)]) == 0
    record = RunRecord.from_json(json.loads((results / "tiny" / "summary.json").read_text()), "summary.json")
    measured = [f"tiny-r0-{s}" for s in record.round_orders[0]]
    assert [s[0] for s in submitted] == measured  # one job at a time, in the round's order
    assert all(f"--mem={2 * 1024}M" in s and "--no-requeue" in s for s in submitted)
    ids = []
    for name, done in record.strategies.items():
        assert done.ok, (name, done.error)
        assert done.job_ids is not None and done.job_ids.isdigit()
        assert done.node == slurm.node and done.limit_enforcer == WATCHER_ENFORCER
        ids.append(done.job_ids)
    assert len(set(ids)) == 2
    assert not (results / "tiny" / "jobs").exists()  # the jobs' files are not published
    assert _squeue(SlurmClient()) == ""


def test_a_job_cancelled_mid_run_is_a_failed_strategy_naming_the_job_and_the_run_goes_on(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    client = SlurmClient()
    scenario = load_scenario(_tiny(tmp_path))
    done: list[RunRecord] = []
    runs = SlurmRuns(scenario.cluster, client)
    thread = threading.Thread(target=lambda: done.append(run_scenario(
        scenario, results=tmp_path / "results", command=_sleeper, supervisor=runs.watch)))
    thread.start()
    job = _first_job(client)
    client._run(["scancel", job])  # from outside, as a user or an admin would
    thread.join(60)
    (record,) = done
    failed = record.strategies["map"]
    assert not failed.ok and failed.job_ids == job
    assert f"Slurm job {job}" in (failed.error or "") and "CANCELLED" in (failed.error or "")
    published = json.loads((tmp_path / "results" / "tiny" / "summary.json").read_text())
    assert published["strategies"]["map"]["error"] == failed.error
    assert _nothing_queued(client) == ""


def test_ctrl_c_cancels_the_running_job_and_leaves_nothing_queued(slurm: LocalSlurm, tmp_path: Path) -> None:
    client = SlurmClient()
    scenario = load_scenario(_tiny(tmp_path, run="warmup = 1\n"))
    jobs: list[str] = []

    def interrupt() -> None:
        jobs.append(_first_job(client))
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(RunInterrupted, match=r"interrupted by SIGINT; Slurm job \d+ was cancelled"):
        run_scenario(scenario, results=tmp_path / "results", command=_sleeper,
                     supervisor=SlurmRuns(scenario.cluster, client, poll_s=0.2).watch)
    assert client.live == []
    assert _nothing_queued(client) == ""
    assert client.state(jobs[0]).state.startswith("CANCELLED")
    shown = client._run(["scontrol", "show", "job", "-o", jobs[0]]).stdout
    assert "JobName=tiny-w0-map " in shown  # a warm-up round's worker is a job too
    assert not (tmp_path / "results" / "tiny").exists()


# What each state means, with Slurm's answers given by a fake client.

class _FakeClient(SlurmClient):
    def __init__(self, states: list[str]) -> None:
        super().__init__()
        self.states, self.options = states, []  # type: ignore[var-annotated]

    def submit(self, name: str, script: str, options: Any) -> str:
        self.options.append(list(options))
        return str(len(self.options))

    def state(self, job_id: str) -> JobState:
        return JobState(job_id, self.states[int(job_id) - 1], "None", "n1", "0:0")


def _plan(tmp_path: Path, limit: int | None) -> Any:
    return SimpleNamespace(memory_limit_bytes=limit, workdir=tmp_path / "engines",
                           scenario=SimpleNamespace(run=SimpleNamespace(timeout_s=60.0)))


def test_out_of_memory_is_the_worker_stopped_at_its_limit_a_result_of_its_own(tmp_path: Path) -> None:
    client = _FakeClient(["OUT_OF_MEMORY"])
    ended = SlurmRuns(ClusterSettings(), client).watch(_plan(tmp_path, GIB), ["true"], tmp_path, "oom")
    assert ended.stopped_by_cluster and ended.job_ids == ("1",)
    assert "--mem=1024M" in client.options[0]
    assert "OUT_OF_MEMORY" in (ended.reason or "") and "--mem=1024M" in (ended.reason or "")
    assert no_result_of_its_own(ended, None) is None  # the strategy's memory: recorded, the run goes on
    record = strategy_record(ended, None)
    assert not record.ok and record.job_ids == "1" and record.node == "n1"
    assert record.limit_enforcer == "Slurm's job cgroup (--mem=1024M)"


def test_a_timed_out_job_fails_with_the_reason_and_no_limit_asks_no_mem(tmp_path: Path) -> None:
    client = _FakeClient(["TIMEOUT"])
    ended = SlurmRuns(ClusterSettings(), client).watch(_plan(tmp_path, None), ["true"], tmp_path, "slow")
    assert not any(o.startswith("--mem") for o in client.options[0]) and "--time=2:00" in client.options[0]
    assert ended.stopped_by_cluster and "TIMEOUT" in (ended.reason or "")
    assert "Slurm job 1 on n1" in (ended.reason or "")


def test_a_job_the_cluster_lost_is_submitted_again_and_lost_too_often_is_no_result(tmp_path: Path) -> None:
    again = _FakeClient(["PREEMPTED", "NODE_FAIL", "CANCELLED by 0"])
    ended = SlurmRuns(ClusterSettings(), again).watch(_plan(tmp_path, GIB), ["true"], tmp_path, "lost")
    assert ended.job_ids == ("1", "2", "3") and "CANCELLED" in (ended.reason or "")
    gave_up = SlurmRuns(ClusterSettings(), _FakeClient(["PREEMPTED"] * 3)).watch(
        _plan(tmp_path, GIB), ["true"], tmp_path, "lost3")
    assert not gave_up.stopped_by_cluster
    assert "lost by the cluster 3 times" in (no_result_of_its_own(gave_up, None) or "")


def test_sweep_runs_each_scenario_with_mode_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[tuple[str, Any]] = []

    def run_scenario(scenario: Scenario, *, results: Path, render: Any, supervisor: Any) -> RunRecord:
        ran.append((scenario.name, supervisor))
        raise HarnessError(f"{scenario.name} ran")

    from harness import run as run_module

    monkeypatch.setattr(run_module, "run_scenario", run_scenario)
    file = _tiny(tmp_path)
    assert main(["sweep", str(file), "--mode", "run", "--engines", "1,2", "--results", str(tmp_path / "r")]) == 1
    assert [name for name, _ in ran] == ["tiny-e1", "tiny-e2"]
    summary = (tmp_path / "r" / "matrix.sweep.md").read_text()
    assert "2 runs" in summary and "failed: tiny-e1 ran" in summary
