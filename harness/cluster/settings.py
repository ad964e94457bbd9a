"""A scenario's ``[cluster]`` table: what every Slurm job of its runs and sweeps asks for.

``partition``, ``account``: ``sbatch --partition``/``--account`` (the cluster's defaults where absent). ``time``:
a run's job's time limit in Slurm's format (``HH:MM:SS``, ``D-HH:MM``; default: the scenario's ``run.timeout_s``
plus a minute); a budget attempt's job gets its own timeout plus a minute instead, since the attempt's own
timeout ends it first. ``gpus``: ``--gpus`` per job (0: none asked). ``cpus``: ``--cpus-per-task`` (default 1: on
a node with N CPUs, N attempts run at once). ``sbatch_options``: more options, passed as they are
(``["--qos=short", "--constraint=a100"]``). A job's memory is never here: it is the limit being measured
(``--mem``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["EXECUTORS", "ClusterSettings", "settings_problem"]

EXECUTORS = ("local", "slurm")
"""``--executor``'s choices: attempts and worker runs as processes of this machine, or as Slurm jobs."""

_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
_OWN = ("--mem", "--mem-per-cpu", "--mem-per-gpu", "--output", "--error", "--parsable", "--wrap", "--job-name",
        "--time", "--gpus", "--cpus-per-task", "--partition", "--account")


@dataclass(frozen=True)
class ClusterSettings:
    """The ``[cluster]`` table; see the module docstring."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    gpus: int = 0
    cpus: int = 1
    sbatch_options: tuple[str, ...] = field(default_factory=tuple)

    def sbatch_args(self) -> list[str]:
        """The ``sbatch`` options these settings ask for (memory and time not included)."""
        args = []
        if self.partition:
            args.append(f"--partition={self.partition}")
        if self.account:
            args.append(f"--account={self.account}")
        if self.gpus:
            args.append(f"--gpus={self.gpus}")
        args.append(f"--cpus-per-task={self.cpus}")
        return [*args, *self.sbatch_options]


def settings_problem(settings: ClusterSettings) -> str | None:
    """What is wrong with ``settings`` (naming the key), or None."""
    if settings.time is not None and not _TIME.match(settings.time):
        return f"time: expected Slurm's time format (MM, MM:SS, HH:MM:SS, D-HH:MM), got {settings.time!r}"
    if settings.gpus < 0:
        return f"gpus: expected 0 or more, got {settings.gpus}"
    if settings.cpus < 1:
        return f"cpus: expected 1 or more, got {settings.cpus}"
    for option in settings.sbatch_options:
        if not option.startswith("-"):
            return f"sbatch_options: {option!r} is not an option (it must start with '-')"
        name = option.split("=")[0]
        if name in _OWN:
            return (f"sbatch_options: {name} is set by the harness (memory is the limit being measured; the others "
                    f"have keys of their own)")
    return None
