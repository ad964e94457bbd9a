"""The job's side of a budget attempt run as a Slurm job: ``python -m harness.cluster.attempt SPEC RESULT``.

``SPEC`` (JSON, written by :mod:`harness.cluster.executor`): ``command``, ``limit_bytes``, ``timeout_s``,
``cold_files``. The command runs once through :func:`harness.budget.cgroup.run_in_group`, as a local attempt does:
cold cache, a fresh memory group limited to ``limit_bytes`` (the job's ``--mem``), the group's peak and OOM kills
read. ``RESULT`` gets the :class:`~harness.budget.cgroup.Attempt`'s fields, the node (this host's name) and
``enforcer``: which limit bounds the attempt (:func:`enforcer`). Exit status 0 once ``RESULT`` is written, whatever
the command did (its status is in ``RESULT``); 3 where no memory group could be made (the reason in ``RESULT``).

Where the cluster constrains a job's memory itself (``TaskPlugin=task/cgroup`` with ``ConstrainRAMSpace=yes``), this
process sits in the job's memory cgroup, limited to ``--mem``: Slurm's cgroup counts this process (tens of MiB of
Python) with the worker's, and kills the job as ``OUT_OF_MEMORY`` when the two pass it. Where it does not, the
harness's own group inside the job is the only enforcer, and the record says so.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from harness.budget.cgroup import run_in_group
from harness.budget.controller import CgroupUnavailable, find_controller
from harness.budget.enclosing import enclosing_groups
from harness.fileio.atomic import write_atomic
from harness.units import gib_or_mib

__all__ = ["HARNESS_ENFORCER", "enforcer", "main"]

HARNESS_ENFORCER = ("the harness's memory cgroup inside the job (Slurm does not constrain the job's memory here: "
                    "no task/cgroup with ConstrainRAMSpace)")


def enforcer(limit_bytes: int, job_id: str | None = None, cgroup_file: Path = Path("/proc/self/cgroup"),
             root: Path = Path("/sys/fs/cgroup"), inner: str = "the harness's group",
             fallback: str = HARNESS_ENFORCER) -> str:
    """Which limit bounds a process of ``limit_bytes`` in job ``job_id``: Slurm's job cgroup where this process
    sits in one (its path names ``job_<id>``) limited to at most ``limit_bytes`` (with ``inner``, the harness's own
    limit inside it), else ``fallback`` (a budget attempt's: :data:`HARNESS_ENFORCER`)."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID")
    try:
        lines = cgroup_file.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if job_id is None or f"job_{job_id}" not in path:
            continue
        version, base = (2, root) if controllers == "" else (1, root / "memory")
        if version == 1 and "memory" not in controllers.split(","):
            continue
        for group in enclosing_groups(version, base / path.lstrip("/"), base):
            if f"job_{job_id}" in str(group.path) and group.limit_bytes <= limit_bytes:
                return (f"Slurm's job cgroup ({gib_or_mib(group.limit_bytes)} at {group.path}, ConstrainRAMSpace), "
                        f"{inner} inside it")
    return fallback


def main(argv: list[str]) -> int:
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    spec = json.loads(spec_path.read_text())
    limit = int(spec["limit_bytes"])
    out: dict[str, object] = {"node": socket.gethostname().split(".")[0], "enforcer": enforcer(limit)}
    status = 0
    try:
        attempt = run_in_group(spec["command"], limit, float(spec["timeout_s"]), cold_files=spec["cold_files"],
                               echo_stderr=True, controller=find_controller())
        out.update(limit_bytes=attempt.limit_bytes, completed=attempt.completed, returncode=attempt.returncode,
                   wall_s=attempt.wall_s, group_peak_bytes=attempt.group_peak_bytes, oom_kills=attempt.oom_kills,
                   reason=attempt.reason, counters=dict(attempt.counters))
    except CgroupUnavailable as exc:
        out.update(error=f"no memory cgroup inside the job: {exc}")
        status = 3
    write_atomic(result_path, json.dumps(out))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
