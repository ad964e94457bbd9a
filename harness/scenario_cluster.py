"""A scenario's ``[cluster]`` table: what every Slurm job of its budget sweeps asks for (``--executor slurm``).

``partition``, ``account``: ``sbatch --partition``/``--account`` (the cluster's defaults where absent). ``time``:
the longest a job may run, in Slurm's format (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH:MM``; default: the attempt's
own timeout plus a minute, :data:`harness.cluster.executor.TIME_MARGIN_S`, since the attempt's timeout ends it
first). ``gpus``: ``--gpus`` per job (0: none asked). ``cpus``: ``--cpus-per-task`` (on a node with N CPUs, N / cpus
attempts run at once). ``sbatch_options``: more options, passed as they are (``["--qos=short",
"--constraint=a100"]``); the options the harness sets itself are refused there. A job's memory is never here: it
is the limit being measured (``--mem``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["EXECUTORS", "ClusterSettings"]

EXECUTORS = ("local", "slurm")
"""``--executor``'s choices: attempts as processes of this machine, or as Slurm jobs."""

_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
_OWN = ("--mem", "--mem-per-cpu", "--mem-per-gpu", "--output", "--error", "--parsable", "--wrap", "--job-name",
        "--time", "--gpus", "--cpus-per-task", "--partition", "--account", "--requeue", "--no-requeue")


def _time_problem(time: str | None) -> str | None:
    if time is None or _TIME.match(time):
        return None
    return f"expected Slurm's time format (MM, MM:SS, HH:MM:SS, D-HH:MM), got {time!r}"


def _gpus_problem(gpus: int) -> str | None:
    return None if 0 <= gpus <= 1024 else f"expected an integer >= 0 and <= 1024, got {gpus}"


def _cpus_problem(cpus: int) -> str | None:
    return None if 1 <= cpus <= 4096 else f"expected an integer >= 1 and <= 4096, got {cpus}"


def _options_problem(options: tuple[str, ...]) -> str | None:
    for option in options:
        if not option.startswith("-"):
            return f"{option!r} is not an option (it must start with '-')"
        name = option.split("=")[0]
        if name in _OWN:
            return (f"{name} is set by the harness (memory is the limit being measured; the others have keys of "
                    f"their own or are the harness's)")
    return None


@dataclass(frozen=True)
class ClusterSettings:
    """The ``[cluster]`` table; see the module docstring."""

    partition: str | None = None
    account: str | None = None
    time: str | None = field(default=None, metadata={"check": _time_problem})
    gpus: int = field(default=0, metadata={"check": _gpus_problem})
    cpus: int = field(default=1, metadata={"check": _cpus_problem})
    sbatch_options: tuple[str, ...] = field(default=(), metadata={"check": _options_problem})

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
