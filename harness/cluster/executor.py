"""One budget attempt as one Slurm job whose ``--mem`` is the attempt's limit.

:meth:`SlurmAttempts.attempt` writes the attempt's spec beside its results (the results directory must be on a
filesystem the nodes share), submits ``python -m harness.cluster.attempt SPEC RESULT`` with ``--mem`` set to the
limit (whole MiB, rounded up) and ``--time`` to the attempt's timeout plus :data:`TIME_MARGIN_S` (the attempt's own
timeout ends it first; Slurm's is the backstop), waits for the job to end and returns a
:class:`~harness.budget.remote.RemoteAttempt`: the :class:`~harness.budget.cgroup.Attempt` a local attempt returns,
and the job's id, node and the limit's enforcer.

A job is one slot of the cluster: it asks ``--cpus-per-task`` of the ``[cluster]`` table's ``cpus`` (1 by default)
and its script sets ``OMP_NUM_THREADS`` to the same number (:func:`job_script`), so that torch's intra-op threads
in the worker match the CPUs the job holds. A cluster that binds jobs to their CPUs gives torch that count anyway;
one that does not (``task/none``, as the one-node Slurm of the tests) would otherwise let each worker start a thread
per core of the node beside the other jobs on it. Local attempts keep torch's default.

What each end means is :mod:`harness.cluster.states`: a job the cluster lost (preempted, node failed) is submitted
again, at most :data:`RETRIES` times, each lost job named in the reason; ``OUT_OF_MEMORY`` is an attempt that
failed for memory; a cancelled or timed-out job is a failed attempt saying so; a job that ran but left no result
is a failed attempt with the end of its output. ``sbatch`` refusing is :class:`~harness.cluster.slurm.SbatchRefused`
(an error, not an attempt). :meth:`SlurmAttempts.stop` (an interrupted sweep) cancels every job submitted and not
ended, by id, and makes each waiting :meth:`~SlurmAttempts.attempt` raise :class:`Stopped`.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from harness.budget.cgroup import Attempt
from harness.budget.remote import RemoteAttempt
from harness.cluster.slurm import POLL_S, RETRIES, SlurmClient, submit_until_kept
from harness.cluster.states import Outcome, describe, outcome
from harness.errors import HarnessError
from harness.fileio.atomic import write_atomic
from harness.scenario_cluster import ClusterSettings
from harness.units import MIB

__all__ = ["BEHIND_NICE", "POLL_S", "RETRIES", "TIME_MARGIN_S", "RemoteAttempt", "SlurmAttempts", "Stopped",
           "job_script", "slurm_time"]

TIME_MARGIN_S = 60
"""A job's time limit beyond its attempt's timeout: Python's start, the cold-cache drop, Slurm's own steps."""


BEHIND_NICE = 100
"""``sbatch --nice`` of an attempt's job that yields (``behind``). The strategies' bisections run at once, each a chain
of attempts whose next job is submitted when its last ends, and Slurm starts pending jobs first in, first out: every
chain then advances one attempt per round, and the longest (``map``'s, which adds the curve's points after its
minimum) runs its last attempts alone while a slot idles. Its jobs going first instead keep the slots busy to the
end. 100 is more than the jobs a sweep has pending at once (one per strategy), so it orders them under
``priority/basic``; beside a site's multifactor priorities (thousands and more) it moves them little against other
users' jobs. A user may only lower a job's priority (a positive nice), so the shorter chains yield."""


class Stopped(Exception):
    """The executor was stopped (an interrupted sweep) while this attempt's job was queued or running."""


def slurm_time(seconds: float) -> str:
    """``sbatch --time``'s ``minutes:seconds`` for ``seconds``, rounded up to a whole second."""
    whole = math.ceil(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def job_script(command: Sequence[str], cpus: int) -> str:
    """The shell script of a job that holds ``cpus`` CPUs and runs ``command``: torch's threads (``OMP_NUM_THREADS``)
    set to ``cpus``, then ``command`` in the shell's place."""
    return f"#!/bin/sh\nexport OMP_NUM_THREADS={cpus}\nexec {shlex.join(command)}\n"


class SlurmAttempts:
    """Runs budget attempts as Slurm jobs through ``client`` with ``settings``; see the module docstring."""

    def __init__(self, settings: ClusterSettings, client: SlurmClient | None = None,
                 python: Sequence[str] = (sys.executable,), poll_s: float = POLL_S) -> None:
        self.settings, self.client = settings, client or SlurmClient()
        self.python, self.poll_s = tuple(python), poll_s
        self._stop = threading.Event()

    def describe(self) -> str:
        """What each attempt is, for the record: the job, its memory and its CPUs."""
        cpus = self.settings.cpus
        return (f"each attempt a Slurm job whose --mem is its limit, with --cpus-per-task={cpus} and its worker's "
                f"threads set to match (OMP_NUM_THREADS={cpus})")

    def stop(self) -> list[str]:
        """Cancel every job submitted and not ended (by id); waiting attempts raise :class:`Stopped`. Returns the
        ids cancelled."""
        self._stop.set()
        return self.client.cancel_all()

    def attempt(self, command: Sequence[str], limit_bytes: int, timeout_s: float, cold_files: Iterable[str | Path],
                directory: Path, name: str, time_s: float | None = None, behind: bool = False) -> RemoteAttempt:
        """Run ``command`` under ``limit_bytes`` as a job named ``name``, its files in ``directory``; ``time_s``: the
        job's time limit (default: ``timeout_s`` + :data:`TIME_MARGIN_S`); ``behind``: the job yields to pending jobs
        that do not (``--nice=``:data:`BEHIND_NICE`, before the ``[cluster]`` table's options, which may set
        another)."""
        directory = Path(directory).resolve()
        spec, result = directory / f"{name}.spec.json", directory / f"{name}.result.json"
        write_atomic(spec, json.dumps({"command": list(command), "limit_bytes": limit_bytes, "timeout_s": timeout_s,
                                       "cold_files": [str(f) for f in cold_files]}))
        script = job_script([*self.python, "-m", "harness.cluster.attempt", str(spec), str(result)], self.settings.cpus)
        mem_mib = -(-limit_bytes // MIB)
        nice = [f"--nice={BEHIND_NICE}"] if behind else []
        options = [f"--mem={mem_mib}M", f"--time={self._time(time_s, timeout_s)}",
                   f"--output={directory / name}.%j.out", "--no-requeue", *nice, *self.settings.sbatch_args()]
        done = submit_until_kept(self.client, name, script, options, check=self._check, poll_s=self.poll_s,
                                 sleep=self._stop.wait, before=lambda: result.unlink(missing_ok=True))
        jobs, state, job, lost, ran_s = done.job_ids, done.state, done.job, done.lost, done.ran_s
        if done.gave_up:
            return RemoteAttempt(Attempt(limit_bytes, False, None, ran_s, None, None,
                                          f"lost by the cluster {len(lost)} times: {'; '.join(lost)}"),
                                  jobs, state.node, None)
        kind = outcome(state.state)
        note = f" (after {'; '.join(lost)}, submitted again)" if lost else ""
        where = f"job {job} under --mem={mem_mib}M"
        if kind is Outcome.RAN and result.exists():
            data = json.loads(result.read_text())
            if "error" in data:
                raise HarnessError(f"{where}: {data['error']}")
            attempt = Attempt(limit_bytes, bool(data["completed"]), data["returncode"], float(data["wall_s"]),
                              data["group_peak_bytes"], data["oom_kills"],
                              None if data["reason"] is None and not note else f"{data['reason'] or 'completed'}{note}",
                              data.get("counters", {}))
            return RemoteAttempt(attempt, jobs, data["node"], data["enforcer"])
        if kind is Outcome.RAN:
            why = f"{where} ended (exit code {state.exit_code}) without a result: {self._tail(directory, name, job)}"
        else:
            why = f"{where}: {describe(state.state, state.reason)}"
        return RemoteAttempt(Attempt(limit_bytes, False, None, ran_s, None, None, why + note), jobs, state.node,
                              None)

    def _time(self, time_s: float | None, timeout_s: float) -> str:
        if time_s is not None:
            return slurm_time(time_s)
        return self.settings.time or slurm_time(timeout_s + TIME_MARGIN_S)

    def _check(self, job: str) -> None:
        if self._stop.is_set():
            raise Stopped(f"job {job} cancelled")

    @staticmethod
    def _tail(directory: Path, name: str, job: str) -> str:
        try:
            lines = (directory / f"{name}.{job}.out").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no output"
        return " | ".join(lines[-3:]) or "no output"
