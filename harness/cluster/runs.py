"""A run's workers as Slurm jobs (``python -m harness run SCENARIO --executor slurm``): one job per worker run.

:meth:`SlurmRuns.watch` is a :data:`harness.watch.Supervisor`: it writes the run's spec into the directory it is
given (under the results root, which must be on a filesystem the nodes share), submits ``python -m
harness.cluster.run_job SPEC RESULT`` with the scenario's ``[cluster]`` settings, ``--mem`` of the scenario's
``run.memory_limit_gib`` where it sets one (whole MiB, rounded up) and ``--time`` of its timeout plus
:data:`~harness.cluster.executor.TIME_MARGIN_S` (or the ``[cluster]`` table's ``time``), waits for the job to end
and returns the :class:`~harness.watch.Outcome` a local worker's watcher returns, naming the jobs, the node and the
limit's enforcer. In the job the worker is watched as it is here (:mod:`harness.cluster.run_job`); the worker writes
its record and samples into the results directory, where the run reads them as it does a local worker's.

What each end means is :mod:`harness.cluster.states`: ``OUT_OF_MEMORY`` is the worker stopped at its memory limit (by
Slurm), a cancelled or timed-out job a failed run whose reason names the job and the state (both the strategy's
result, as the watcher's own stops are); a job the cluster lost (preempted, node failed) is submitted again, at most
:data:`~harness.cluster.slurm.RETRIES` times, and one lost more often, or one that ran and left no result, has no
result of its own (:func:`harness.watch.no_result_of_its_own`: the run is not published). One job at a time: a round's
strategies run one after another, as they do here, so that no two measurements share a machine.

SIGINT, SIGTERM or SIGHUP while a job is queued or running (within :func:`harness.stopping.raising`) cancels it by id
and raises :class:`~harness.stopping.Interrupted`; whatever ends the wait, no job it submitted is left queued.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from harness import stopping
from harness.cluster.executor import TIME_MARGIN_S, slurm_time
from harness.cluster.run_job import OUTCOME_FIELDS
from harness.cluster.slurm import POLL_S, SlurmClient, submit_until_kept
from harness.cluster.states import Outcome as Ends
from harness.cluster.states import describe, outcome
from harness.fileio.atomic import write_atomic
from harness.plan import Plan
from harness.progress import print_progress
from harness.scenario_cluster import ClusterSettings
from harness.units import MIB, format_gib
from harness.watch import Outcome

__all__ = ["SlurmRuns"]


class SlurmRuns:
    """Runs each worker as one Slurm job through ``client`` with ``settings``; see the module docstring."""

    def __init__(self, settings: ClusterSettings, client: SlurmClient | None = None,
                 python: Sequence[str] = (sys.executable,), poll_s: float = POLL_S) -> None:
        self.settings, self.client = settings, client or SlurmClient()
        self.python, self.poll_s = tuple(python), poll_s

    def watch(self, plan: Plan, command: Sequence[str], files: Path, name: str) -> Outcome:
        """Run ``command`` (one strategy's worker) as job ``name``, its spec, result and output in ``files``; what
        it left in the plan's engine directory is removed after it."""
        try:
            with stopping.deferred():
                return self._run(plan, command, Path(files).resolve(), name)
        finally:
            self.client.cancel_all()  # an error while waiting leaves nothing queued; after an end, nothing to cancel
            shutil.rmtree(plan.workdir, ignore_errors=True)

    def _run(self, plan: Plan, command: Sequence[str], files: Path, name: str) -> Outcome:
        limit, timeout_s = plan.memory_limit_bytes, plan.scenario.run.timeout_s
        files.mkdir(parents=True, exist_ok=True)
        spec, result = files / f"{name}.spec.json", files / f"{name}.result.json"
        write_atomic(spec, json.dumps({"command": list(command), "limit_bytes": limit, "timeout_s": timeout_s}))
        script = "#!/bin/sh\nexec " + shlex.join([*self.python, "-m", "harness.cluster.run_job", str(spec),
                                                   str(result)]) + "\n"
        mem = None if limit is None else f"--mem={-(-limit // MIB)}M"
        options = [*([mem] if mem else []), f"--time={self.settings.time or slurm_time(timeout_s + TIME_MARGIN_S)}",
                   f"--output={files / name}.%j.out", "--no-requeue", *self.settings.sbatch_args()]
        done = submit_until_kept(self.client, name, script, options, check=self._check, poll_s=self.poll_s,
                                 before=lambda: result.unlink(missing_ok=True),
                                 submitted=lambda job: print_progress(f"{name}: Slurm job {job} submitted"))
        state, job, ends = done.state, done.job, outcome(done.state.state)
        if done.gave_up:  # the cluster's failure, not the strategy's: no result of its own
            return Outcome(None, f"lost by the cluster {len(done.lost)} times: {'; '.join(done.lost)}", 0,
                           job_ids=done.job_ids, node=state.node)
        ids, where = done.job_ids, f"Slurm job {job} on {state.node or 'no node'}"
        output = self._output(files, name, job)
        if output:
            sys.stderr.write(output if output.endswith("\n") else output + "\n")
        if ends is Ends.RAN and result.exists():
            data = json.loads(result.read_text())
            return Outcome(**{key: data[key] for key in OUTCOME_FIELDS}, job_ids=ids, node=data["node"],
                           limit_enforcer=data["enforcer"])
        if ends is Ends.RAN:  # the job's own side failed: the machine's, not the strategy's
            tail = " | ".join(output.strip().splitlines()[-3:]) or "no output"
            return Outcome(None, f"{where} ended (exit code {state.exit_code}) without a result: {tail}", 0,
                           job_ids=ids, node=state.node)
        if ends is Ends.OUT_OF_MEMORY:
            assert limit is not None and mem is not None
            return Outcome(None, f"stopped by Slurm: {where} went past {mem}, the scenario's memory limit of "
                                 f"{format_gib(limit)} ({describe(state.state, state.reason)})", 0,
                           stopped_by_cluster=True, job_ids=ids, node=state.node,
                           limit_enforcer=f"Slurm's job cgroup ({mem})")
        return Outcome(None, f"{where}: {describe(state.state, state.reason)}", 0, stopped_by_cluster=True,
                       job_ids=ids, node=state.node)

    def _check(self, job: str) -> None:
        """A signal caught while ``job`` is queued or runs cancels it and raises
        :class:`~harness.stopping.Interrupted`."""
        signum = stopping.pending()
        if signum is not None:
            self.client.cancel([job])
            raise stopping.Interrupted(signum, f"Slurm job {job} was cancelled")

    @staticmethod
    def _output(files: Path, name: str, job: str) -> str:
        try:
            return (files / f"{name}.{job}.out").read_text(errors="replace")
        except OSError:
            return ""

