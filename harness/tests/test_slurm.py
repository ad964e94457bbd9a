"""Budget attempts as Slurm jobs, against a real one-node Slurm started on this machine (the ``slurm`` fixture,
skipped with the reason where its daemons cannot start), and what each job state means (no Slurm needed)."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.budget.controller import MemoryController
from harness.budget.mode import run_budget
from harness.budget.record import read_budget
from harness.cluster.attempt import HARNESS_ENFORCER
from harness.cluster.executor import BEHIND_NICE, SlurmAttempts, Stopped, slurm_time
from harness.cluster.slurm import JobState, SbatchRefused, SlurmClient
from harness.cluster.states import Outcome, describe, outcome
from harness.scenario import ScenarioError, load_scenario
from harness.scenario_cluster import ClusterSettings
from harness.tests.slurm_cluster import EPILOG, LocalSlurm
from harness.units import MIB

PY = sys.executable


def _squeue(client: SlurmClient) -> str:
    return client._run(["squeue", "-h", "-o", "%i %T"]).stdout.strip()


def test_a_trivial_job_runs_and_its_state_and_node_are_read(slurm: LocalSlurm, tmp_path: Path) -> None:
    client = SlurmClient()
    job = client.submit("trivial", "#!/bin/sh\nhostname\n", [f"--output={tmp_path}/out.%j"])
    assert client.live == [job]
    deadline = time.monotonic() + 60
    state = client.state(job)
    while outcome(state.state) is Outcome.WAIT and time.monotonic() < deadline:
        time.sleep(0.3)
        state = client.state(job)
    assert state.state == "COMPLETED"
    assert state.node == slurm.node
    assert state.exit_code == "0:0"


def test_the_node_runs_an_epilog_so_a_jobs_end_schedules_the_next_at_once(slurm: LocalSlurm) -> None:
    # with an epilog the node reports a job's end as MESSAGE_EPILOG_COMPLETE, on which slurmctld schedules at once;
    # without one a pending job waits for the scheduler's next periodic pass (an idle slot for up to a second)
    shown = subprocess.run(["scontrol", "show", "config"], env={**os.environ, **slurm.env}, capture_output=True,
                           text=True, check=True).stdout
    settings = {key.strip(): value.strip() for key, _, value in (line.partition(" = ") for line in shown.splitlines())}
    assert settings["Epilog"] == EPILOG
    assert os.access(EPILOG, os.X_OK)


def test_an_attempt_is_a_job_under_its_limit_naming_job_node_and_enforcer(slurm: LocalSlurm, tmp_path: Path,
                                                                          controller: object) -> None:
    runner = SlurmAttempts(ClusterSettings())
    fits = runner.attempt([PY, "-c", "pass"], 256 * MIB, 60, (), tmp_path, "fits")
    assert fits.attempt.completed, fits.attempt.reason
    assert fits.attempt.group_peak_bytes is not None
    assert fits.node == slurm.node and len(fits.job_ids) == 1
    assert fits.enforcer == HARNESS_ENFORCER
    grows = "b = bytearray(400 * 2**20); b[::4096] = b'x' * len(b[::4096])"
    killed = runner.attempt([PY, "-c", grows], 128 * MIB, 60, (), tmp_path, "killed")
    assert not killed.attempt.completed
    assert "OOM" in (killed.attempt.reason or "") or "oom" in (killed.attempt.reason or "")
    assert killed.job_ids != fits.job_ids


def test_an_attempts_worker_runs_torch_on_one_thread_as_its_job_holds_one_cpu(slurm: LocalSlurm, tmp_path: Path,
                                                                            controller: object) -> None:
    one_thread = "import sys, torch; sys.exit(torch.get_num_threads())"
    done = SlurmAttempts(ClusterSettings()).attempt([PY, "-c", one_thread], 512 * MIB, 60, (), tmp_path, "one")
    assert done.attempt.returncode == 1, done.attempt.reason


def test_a_cancelled_job_is_a_failed_attempt_saying_so(slurm: LocalSlurm, tmp_path: Path, controller: object) -> None:
    client = SlurmClient()
    runner = SlurmAttempts(ClusterSettings(), client)
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(
        runner.attempt(["sleep", "120"], 256 * MIB, 300, (), tmp_path, "cancelled")))
    thread.start()
    deadline = time.monotonic() + 60
    while not client.live and time.monotonic() < deadline:
        time.sleep(0.1)
    job = client.live[0]
    client._run(["scancel", job])  # from outside, as a user or an admin would
    thread.join(60)
    (done,) = results
    assert not done.attempt.completed  # type: ignore[attr-defined]
    assert f"job {job}" in done.attempt.reason and "CANCELLED" in done.attempt.reason  # type: ignore[attr-defined]
    assert _squeue(client) == ""


def test_a_timed_out_job_is_a_failed_attempt_saying_so(slurm: LocalSlurm, tmp_path: Path, controller: object) -> None:
    runner = SlurmAttempts(ClusterSettings())
    done = runner.attempt(["sleep", "600"], 256 * MIB, 600, (), tmp_path, "slow", time_s=1)
    assert not done.attempt.completed
    assert "TIMEOUT" in (done.attempt.reason or "")


def test_stop_cancels_every_job_it_submitted_and_leaves_nothing_queued(slurm: LocalSlurm, tmp_path: Path,
                                                                      controller: object) -> None:
    client = SlurmClient()
    runner = SlurmAttempts(ClusterSettings(), client)
    errors: list[BaseException] = []

    def one(name: str) -> None:
        try:
            runner.attempt(["sleep", "120"], 256 * MIB, 300, (), tmp_path, name)
        except Stopped as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(f"stop{i}",)) for i in range(3)]  # 2 slots: one stays queued
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(client.live) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    submitted = client.live
    assert len(submitted) == 3
    assert sorted(runner.stop()) == submitted
    for t in threads:
        t.join(30)
    assert len(errors) == 3
    deadline = time.monotonic() + 30
    while _squeue(client) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert _squeue(client) == ""
    for job in submitted:
        assert client.state(job).state.startswith("CANCELLED")


def test_sbatch_refusing_a_job_is_one_error_naming_it(slurm: LocalSlurm, tmp_path: Path) -> None:
    runner = SlurmAttempts(ClusterSettings(partition="no-such-partition"))
    with pytest.raises(SbatchRefused, match=r"sbatch refused job refused .*partition"):
        runner.attempt(["true"], 64 * MIB, 60, (), tmp_path, "refused")


# What each state means, with Slurm's answers given by a fake client.

class _FakeClient(SlurmClient):
    def __init__(self, states: list[str]) -> None:
        super().__init__()
        self.states, self.submitted = states, 0

    def submit(self, name: str, script: str, options: object) -> str:
        self.submitted += 1
        return str(self.submitted)

    def state(self, job_id: str) -> JobState:
        return JobState(job_id, self.states[int(job_id) - 1], "None", "n1", "0:0")


def test_out_of_memory_is_an_attempt_failed_for_memory_not_an_error(tmp_path: Path) -> None:
    done = SlurmAttempts(ClusterSettings(), _FakeClient(["OUT_OF_MEMORY"])).attempt(
        ["true"], 100 * MIB, 60, (), tmp_path, "oom")
    assert not done.attempt.completed
    assert "OUT_OF_MEMORY" in (done.attempt.reason or "") and "--mem=100M" in (done.attempt.reason or "")
    assert done.job_ids == ("1",)


def test_a_job_the_cluster_lost_is_submitted_again_and_named(tmp_path: Path) -> None:
    client = _FakeClient(["PREEMPTED", "NODE_FAIL", "CANCELLED by 0"])
    done = SlurmAttempts(ClusterSettings(), client).attempt(["true"], 100 * MIB, 60, (), tmp_path, "lost")
    assert done.job_ids == ("1", "2", "3")
    reason = done.attempt.reason or ""
    assert "CANCELLED" in reason and "job 1 on n1" in reason and "NODE_FAIL" in reason
    lost = _FakeClient(["PREEMPTED"] * 3)
    gave_up = SlurmAttempts(ClusterSettings(), lost).attempt(["true"], 100 * MIB, 60, (), tmp_path, "lost3")
    assert not gave_up.attempt.completed and "lost by the cluster 3 times" in (gave_up.attempt.reason or "")


class _Controller(SlurmClient):
    """Slurm's commands answered here: each job RUNNING for its first ``running`` reads (by ``squeue`` or
    ``scontrol``), COMPLETED after; every command asked is kept in ``asked``."""

    def __init__(self, running: int) -> None:
        super().__init__()
        self.running, self.asked, self.scripts = running, [], []  # type: ignore[var-annotated]
        self.reads: collections.Counter[str] = collections.Counter()
        self.guard = threading.Lock()

    def _read(self, job: str) -> str:
        self.reads[job] += 1
        return "RUNNING" if self.reads[job] <= self.running else "COMPLETED"

    def _run(self, args: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        with self.guard:
            self.asked.append(list(args))
            if args[0] == "sbatch":
                self.scripts.append(stdin)
                out = f"{sum(a[0] == 'sbatch' for a in self.asked)};local\n"
            elif args[0] == "squeue":
                out = "".join(f"{job}|{self._read(job)}\n" for job in args[args.index("-j") + 1].split(","))
            elif args[0] == "scontrol":
                out = f"JobId={args[-1]} JobState={self._read(args[-1])} Reason=None BatchHost=n1 ExitCode=0:0\n"
            else:
                out = ""
            return subprocess.CompletedProcess(list(args), 0, out, "")


def test_one_squeue_answers_for_every_job_waited_on() -> None:
    client = _Controller(running=5)
    jobs = [client.submit(f"j{i}", "#!/bin/sh\n", []) for i in range(3)]
    assert [client.poll(job, 3600) for job in jobs] == ["RUNNING"] * 3
    queries = [a for a in client.asked if a[0] != "sbatch"]
    assert queries == [["squeue", "-h", "-t", "all", "-j", "1,2,3", "-o", "%i|%T"]]


def test_attempts_waiting_together_read_each_job_in_full_once_at_its_end(tmp_path: Path) -> None:
    client = _Controller(running=4)
    runner = SlurmAttempts(ClusterSettings(), client, poll_s=0.01)
    done: list[object] = []
    threads = [threading.Thread(target=lambda i=i: done.append(
        runner.attempt(["true"], 64 * MIB, 60, (), tmp_path, f"a{i}"))) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(done) == 3
    shown = sorted(a[-1] for a in client.asked if a[0] == "scontrol")
    assert shown == ["1", "2", "3"], "scontrol once per job, when squeue shows it ended; squeue while it runs"
    assert all(a[0] in ("sbatch", "squeue", "scontrol") for a in client.asked)


@pytest.mark.parametrize("cpus", [1, 2])
def test_an_attempts_job_asks_for_its_cpus_and_sets_torchs_threads_to_them(tmp_path: Path, cpus: int) -> None:
    client = _Controller(running=0)
    runner = SlurmAttempts(ClusterSettings(cpus=cpus), client)
    runner.attempt(["true"], 64 * MIB, 60, (), tmp_path, "threads")
    (sbatch,) = [a for a in client.asked if a[0] == "sbatch"]
    assert f"--cpus-per-task={cpus}" in sbatch
    (script,) = client.scripts
    assert f"\nexport OMP_NUM_THREADS={cpus}\nexec " in script
    assert f"--cpus-per-task={cpus}" in runner.describe() and f"OMP_NUM_THREADS={cpus}" in runner.describe()


@pytest.mark.parametrize("behind", [False, True])
def test_an_attempt_behind_yields_to_the_others_with_a_nice_the_clusters_table_may_override(
        tmp_path: Path, behind: bool) -> None:
    client = _Controller(running=0)
    runner = SlurmAttempts(ClusterSettings(sbatch_options=("--nice=7",)), client)
    runner.attempt(["true"], 64 * MIB, 60, (), tmp_path, "nice", behind=behind)
    (sbatch,) = [a for a in client.asked if a[0] == "sbatch"]
    nice = [a for a in sbatch if a.startswith("--nice")]
    assert nice == ([f"--nice={BEHIND_NICE}", "--nice=7"] if behind else ["--nice=7"]), "the table's, last, wins"


def test_states() -> None:
    assert outcome("CANCELLED by 0") is Outcome.ENDED
    assert outcome("COMPLETED") is Outcome.RAN and outcome("FAILED") is Outcome.RAN
    assert outcome("RUNNING") is Outcome.WAIT and outcome("PENDING") is Outcome.WAIT
    assert outcome("PREEMPTED") is Outcome.RETRY and outcome("NODE_FAIL") is Outcome.RETRY
    assert outcome("OUT_OF_MEMORY") is Outcome.OUT_OF_MEMORY
    assert outcome("SOMETHING_NEW") is Outcome.ENDED and "SOMETHING_NEW" in describe("SOMETHING_NEW")
    assert describe("TIMEOUT", "TimeLimit").endswith("Slurm's reason: TimeLimit")


def test_settings(tmp_path: Path) -> None:
    assert slurm_time(61.2) == "1:02"
    assert ClusterSettings(partition="gpu", gpus=1, sbatch_options=("--qos=x",)).sbatch_args() == [
        "--partition=gpu", "--gpus=1", "--cpus-per-task=1", "--qos=x"]
    smoke = (Path(__file__).resolve().parents[2] / "scenarios" / "smoke.toml").read_text()
    file = tmp_path / "s.toml"
    file.write_text(smoke + '\n[cluster]\npartition = "gpu"\ntime = "1-00:00"\nsbatch_options = ["--qos=short"]\n')
    wanted = ClusterSettings(partition="gpu", time="1-00:00", sbatch_options=("--qos=short",))
    assert load_scenario(file).cluster == wanted
    for bad, rule in (('sbatch_options = ["--mem=4G"]', "cluster.sbatch_options: --mem is set by the harness"),
                      ('time = "an hour"', "cluster.time: expected Slurm's time format"), ("cpus = 0", "cluster.cpus")):
        file.write_text(smoke + f"\n[cluster]\n{bad}\n")
        with pytest.raises(ScenarioError, match=rule):
            load_scenario(file)


def test_a_budget_sweep_through_slurm_names_each_attempts_job_node_and_enforcer(
    slurm: LocalSlurm, tmp_path: Path, controller: MemoryController
) -> None:
    from harness.tests.test_budget_mode import NEEDS, scenario, stand_in

    runner = SlurmAttempts(ClusterSettings())
    record = run_budget(scenario(tmp_path, "map", "load"), results=tmp_path / "results", precision_bytes=16 * MIB,
                        command=stand_in, workdir=tmp_path / "engines", controller=controller, min_timeout_s=30,
                        progress=lambda line: None, jobs=runner)
    jobs = []
    for name, swept in record.strategies.items():
        assert swept.ok and swept.minimum_bytes is not None, swept.error
        assert NEEDS[name] * MIB < swept.minimum_bytes < (NEEDS[name] + 64) * MIB
        for attempt in swept.attempts:
            assert attempt.node == slurm.node and attempt.limit_enforcer == HARNESS_ENFORCER
            assert attempt.job_ids is not None
            jobs.append(attempt.job_ids)
            # map's chain is the longer (the curve's points after its minimum): load's jobs yield to its jobs
            shown = runner.client._run(["scontrol", "show", "job", "-o", attempt.job_ids.split(",")[-1]]).stdout
            assert f"Nice={BEHIND_NICE if name == 'load' else 0} " in shown, (name, shown)
    assert len(set(jobs)) == len(jobs), "one job per attempt"
    assert record.controller.endswith(runner.describe())
    assert read_budget(tmp_path / "results" / "tiny-budget") == record
    assert runner.client.live == [] and _squeue(runner.client) == ""
