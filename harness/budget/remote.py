"""What budget mode asks of a runner that runs its attempts elsewhere (a cluster's jobs), and what it gets back.

Budget mode runs each attempt here, in a memory cgroup of its own (:mod:`harness.budget.cgroup`), unless it is
handed a :class:`RemoteAttempts`: then each attempt is run by it (:class:`harness.cluster.executor.SlurmAttempts`
runs each as a Slurm job whose ``--mem`` is the attempt's limit) and comes back as a :class:`RemoteAttempt`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from harness.budget.cgroup import Attempt

__all__ = ["RemoteAttempt", "RemoteAttempts"]


@dataclass(frozen=True)
class RemoteAttempt:
    """An attempt run elsewhere: ``attempt`` as a local one would be, ``job_ids`` every job submitted for it (the
    last one the one that counts; earlier ones were lost by the cluster), ``node`` where the last one ran (None
    where it never started) and ``enforcer`` the limit that bounded it (None where the job never ran the command)."""

    attempt: Attempt
    job_ids: tuple[str, ...]
    node: str | None
    enforcer: str | None


class RemoteAttempts(Protocol):
    """Runs budget attempts elsewhere."""

    def attempt(self, command: Sequence[str], limit_bytes: int, timeout_s: float, cold_files: Iterable[str | Path],
                directory: Path, name: str, time_s: float | None = None, behind: bool = False) -> RemoteAttempt:
        """Run ``command`` under ``limit_bytes``, its files in ``directory``, as a job named ``name``; ``behind``: the
        job yields to the sweep's pending jobs that do not (they belong to a longer chain of attempts)."""
        ...

    def describe(self) -> str:
        """What each attempt is (where it runs, its memory limit, its CPUs), for the record's ``controller``."""
        ...

    def stop(self) -> list[str]:
        """Cancel every job submitted and not ended; returns their ids."""
        ...
