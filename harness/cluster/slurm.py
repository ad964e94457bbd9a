"""Slurm's commands, by job id: submit (``sbatch``), poll all of a client's jobs at once (``squeue``), read a job's
end (``scontrol``, else ``sacct``), cancel; and :func:`submit_until_kept`, the one submit-wait-resubmit loop of
both the budget attempts' and the runs' jobs.

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
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from harness.cluster.states import Outcome, describe, outcome
from harness.errors import HarnessError

__all__ = ["POLL_S", "RETRIES", "JobState", "SbatchRefused", "SlurmClient", "SlurmUnreachable", "Submissions",
           "submit_until_kept", "wait_for"]

COMMAND_TIMEOUT_S = 60.0
RETRIES = 2
"""How many times a job the cluster lost (:data:`~harness.cluster.states.RETRY_STATES`) is submitted again."""
POLL_S = 0.5
"""How often a job's state is read while it is queued or runs."""


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
        self._polled: dict[str, str] = {}
        self._polled_at: float | None = None
        self._poll_lock = threading.Lock()

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

    def poll(self, job_id: str, max_age_s: float) -> str | None:
        """``job_id``'s ``JobState`` as one ``squeue`` answered for every job this client has live, asked at most once
        every ``max_age_s`` whichever thread asks (threads waiting on many jobs cost one query per interval, not one
        each), and again where ``job_id`` is newer than the last answer. None where ``squeue`` does not list it
        (ended and forgotten by the controller, or ``squeue`` failed or is missing): read it with :meth:`state`."""
        with self._poll_lock:
            now = time.monotonic()
            if self._polled_at is None or now - self._polled_at >= max_age_s or job_id not in self._polled:
                ids = sorted({*self.live, job_id}, key=lambda j: (len(j), j))
                try:
                    listed = self._run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T"]).stdout
                except SlurmUnreachable:  # no squeue: every state is read with state()
                    listed = ""
                self._polled = dict(line.split("|", 1) for line in listed.splitlines() if "|" in line)
                self._polled_at = now
            return self._polled.get(job_id)

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


@dataclass(frozen=True)
class Submissions:
    """What :func:`submit_until_kept` did for one piece of work: ``job_ids``, every job submitted, in order (the last
    the one that counts); ``state``, the last one's final state; ``lost``, one line per job the cluster lost (its id,
    node and state); ``ran_s``, how long the last one ran (from the first poll that saw it running; 0 where none
    did)."""

    job_ids: tuple[str, ...]
    state: JobState
    lost: tuple[str, ...]
    ran_s: float

    @property
    def job(self) -> str:
        """The job that counts: the last one submitted."""
        return self.job_ids[-1]

    @property
    def gave_up(self) -> bool:
        """Every job was lost by the cluster: it was submitted :data:`RETRIES` + 1 times."""
        return outcome(self.state.state) is Outcome.RETRY


def wait_for(client: SlurmClient, job: str, poll_s: float, check: Callable[[str], None],
             sleep: Callable[[float], object]) -> tuple[JobState, float]:
    """Poll ``job`` every ``poll_s`` until it ends; returns its final state and how long it ran (from the first poll
    that saw it running). While it is queued or runs its state comes from :meth:`SlurmClient.poll` (one ``squeue``
    for all the client's jobs); once that shows it ended, or no longer lists it, the full state (reason, node, exit
    code) is read once with :meth:`SlurmClient.state`. ``check(job)`` runs before each poll and raises to stop
    waiting (the job is left as it is: cancelling it is the caller's); ``sleep`` waits between polls (an event's
    ``wait`` ends it early)."""
    started: float | None = None
    while True:
        check(job)
        seen = client.poll(job, poll_s)
        if seen is None or outcome(seen) is not Outcome.WAIT:
            state = client.state(job)
            if outcome(state.state) is not Outcome.WAIT:
                client.ended(job)
                return state, 0.0 if started is None else time.monotonic() - started
            seen = state.state
        if started is None and seen.startswith("RUNNING"):
            started = time.monotonic()
        sleep(poll_s)


def submit_until_kept(client: SlurmClient, name: str, script: str, options: Sequence[str], *,
                      check: Callable[[str], None], poll_s: float = POLL_S,
                      sleep: Callable[[float], object] = time.sleep, before: Callable[[], None] = lambda: None,
                      submitted: Callable[[str], None] = lambda job: None) -> Submissions:
    """Submit ``script`` as job ``name`` with ``options`` and wait for it to end (:func:`wait_for` with ``check``,
    ``poll_s`` and ``sleep``); a job the cluster lost (:data:`~harness.cluster.states.RETRY_STATES`) is submitted
    again, at most :data:`RETRIES` times. ``before()`` runs before each submission (removing a previous job's
    result, say), ``submitted(job)`` after it. Raises :class:`SbatchRefused` where ``sbatch`` refuses, and whatever
    ``check`` raises."""
    jobs: list[str] = []
    lost: list[str] = []
    while True:
        before()
        job = client.submit(name, script, options)
        jobs.append(job)
        submitted(job)
        state, ran_s = wait_for(client, job, poll_s, check, sleep)
        if outcome(state.state) is Outcome.RETRY:
            lost.append(f"job {job} on {state.node or 'no node'}: {describe(state.state, state.reason)}")
            if len(lost) <= RETRIES:
                continue
        return Submissions(tuple(jobs), state, tuple(lost), ran_s)
