"""Slurm's commands, by job id: submit (``sbatch``), read a job's state (``scontrol``, else ``sacct``), cancel.

:class:`SlurmClient` keeps the id of every job it submitted that has not ended, so that :meth:`SlurmClient.cancel_all`
(an interrupted sweep's cleanup) cancels exactly those and leaves nothing queued. ``sbatch`` refusing a job (a
partition that does not exist, a limit over the node's memory) is a :class:`SbatchRefused`, one line naming the
job and Slurm's words. The state is read from ``scontrol show job`` while the controller still holds the job
(``MinJobAge`` after its end), else from ``sacct`` where the cluster keeps accounting.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.errors import HarnessError

__all__ = ["JobState", "SbatchRefused", "SlurmClient", "SlurmUnreachable"]

COMMAND_TIMEOUT_S = 60.0


class SbatchRefused(HarnessError):
    """``sbatch`` did not accept a job; the message names the job and says why in Slurm's words."""


class SlurmUnreachable(HarnessError):
    """A Slurm command is missing, or neither ``scontrol`` nor ``sacct`` knows a job this client submitted."""


@dataclass(frozen=True)
class JobState:
    """A job as Slurm states it: ``state`` (``JobState``), ``reason``, ``node`` (``NodeList``; None before it ran) and
    ``exit_code`` (``ExitCode``, ``status:signal``)."""

    job_id: str
    state: str
    reason: str | None
    node: str | None
    exit_code: str | None


def _fields(line: str) -> dict[str, str]:
    """``scontrol show job -o``'s ``Key=Value`` pairs (values hold no spaces except the last ones', which we skip)."""
    out: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep and key not in out:
            out[key] = value
    return out


class SlurmClient:
    """Submits, reads and cancels jobs through Slurm's commands, with ``env`` added to this process's environment
    (``SLURM_CONF`` of a cluster not at the default place, say)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = {**os.environ, **(env or {})}
        self._live: set[str] = set()
        self._lock = threading.Lock()

    def _run(self, args: Sequence[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(list(args), input=stdin, env=self.env, capture_output=True, text=True, check=False,
                                  timeout=COMMAND_TIMEOUT_S)
        except FileNotFoundError as exc:
            raise SlurmUnreachable(f"{args[0]}: not found; the slurm executor needs Slurm's client commands") from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmUnreachable(f"{args[0]} did not answer within {COMMAND_TIMEOUT_S:.0f} s") from exc

    def submit(self, name: str, script: str, options: Sequence[str]) -> str:
        """Submit ``script`` (a shell script's text) as job ``name`` with ``options``; returns the job id."""
        done = self._run(["sbatch", "--parsable", f"--job-name={name}", *options], stdin=script)
        if done.returncode != 0:
            words = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
            raise SbatchRefused(f"sbatch refused job {name} ({' '.join(options)}): {words}")
        job_id = done.stdout.strip().split(";")[0]
        with self._lock:
            self._live.add(job_id)
        return job_id

    def state(self, job_id: str) -> JobState:
        """The job's state now; :class:`SlurmUnreachable` when neither ``scontrol`` nor ``sacct`` knows it."""
        shown = self._run(["scontrol", "show", "job", "-o", job_id])
        if shown.returncode == 0 and shown.stdout.strip():
            f = _fields(shown.stdout.splitlines()[0])
            node = f.get("BatchHost") or f.get("NodeList")
            return JobState(job_id, f.get("JobState", ""), f.get("Reason"),
                            None if node in (None, "(null)", "") else node, f.get("ExitCode"))
        acct = self._run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,Reason,NodeList,ExitCode"])
        for line in acct.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == 5 and parts[0] == job_id:
                return JobState(job_id, parts[1], parts[2] or None, parts[3] or None, parts[4] or None)
        raise SlurmUnreachable(f"job {job_id}: neither scontrol nor sacct knows it "
                               f"({' '.join((shown.stderr + acct.stderr).split())})")

    def ended(self, job_id: str) -> None:
        """Forget ``job_id``: it ended, nothing to cancel."""
        with self._lock:
            self._live.discard(job_id)

    def cancel(self, job_ids: Sequence[str]) -> None:
        """``scancel`` these jobs (by id); they are forgotten whatever ``scancel`` says."""
        if job_ids:
            self._run(["scancel", *job_ids])
        with self._lock:
            self._live.difference_update(job_ids)

    def cancel_all(self) -> list[str]:
        """Cancel every job this client submitted that has not ended; returns their ids."""
        with self._lock:
            live = sorted(self._live)
        self.cancel(live)
        return live

    @property
    def live(self) -> list[str]:
        """The ids of the jobs submitted and not yet seen ending."""
        with self._lock:
            return sorted(self._live)
