"""The job's side of a worker run as a Slurm job: ``python -m harness.cluster.run_job SPEC RESULT``.

``SPEC`` (JSON, written by :mod:`harness.cluster.runs`): ``command`` (the worker's command line), ``limit_bytes``
(the scenario's ``run.memory_limit_gib`` in bytes, or null) and ``timeout_s``. The command runs under
:func:`harness.watch.watch`, as a local run's worker does: the watcher holds the worker and every process it started
to the limit (their summed PSS) and the timeout, and stops them past either. ``RESULT`` gets the watcher's
:class:`~harness.watch.Outcome` fields, the node (this host's name) and ``enforcer``: which limit bounds the worker
(:func:`harness.cluster.attempt.enforcer`; null without a limit). Exit status 0 once ``RESULT`` is written, whatever
the worker did (its status is in ``RESULT``).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import sys
from pathlib import Path

from harness.cluster.attempt import enforcer
from harness.fileio.atomic import write_atomic
from harness.watch import watch

__all__ = ["OUTCOME_FIELDS", "WATCHER_ENFORCER", "main"]

WATCHER_ENFORCER = ("the harness's watcher inside the job (the worker's processes' summed PSS; Slurm does not "
                    "constrain the job's memory here: no task/cgroup with ConstrainRAMSpace)")

OUTCOME_FIELDS = ("returncode", "reason", "peak_rss_bytes", "worker_error", "stopped_by_harness", "out_of_memory")
"""The :class:`~harness.watch.Outcome` fields the job writes: how the worker ended, as the watcher in the job saw it."""


def main(argv: list[str]) -> int:
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    spec = json.loads(spec_path.read_text())
    limit = None if spec["limit_bytes"] is None else int(spec["limit_bytes"])
    outcome = dataclasses.asdict(watch(spec["command"], limit, float(spec["timeout_s"])))
    out: dict[str, object] = {key: outcome[key] for key in OUTCOME_FIELDS}
    out.update(node=socket.gethostname().split(".")[0],
               enforcer=None if limit is None else enforcer(limit, inner="the harness's watcher",
                                                            fallback=WATCHER_ENFORCER))
    write_atomic(result_path, json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
