"""Budget mode: how much host memory a run needs, found by running it under kernel memory limits.

* :mod:`harness.budget.cgroup`: :func:`run_in_group` runs one command in a fresh
  memory cgroup with a limit and swap off, and returns an :class:`Attempt`
  (completed or not and why, wall time, the group's own peak, OOM kills);
  :class:`MemoryGroup` is the group itself, removed whatever happens.
* :mod:`harness.budget.enclosing`: the limits of the groups above the budget's own (a job's, a
  container's) and the machine's memory: the most a budget's group can use
  (:func:`~harness.budget.enclosing.effective_limit`), and which of them an OOM kill came from.
* :mod:`harness.budget.sweep`: :func:`smallest_limit` bisects for the smallest
  limit at which a run completes, keeping every attempt for a wall-time curve.
* each attempt starts cold (:func:`harness.measure.coldcache.prepare_cold`), so its
  group is charged for what it reads.
* :mod:`harness.budget.mode`: :func:`~harness.budget.mode.run_budget` sweeps every
  strategy of a scenario (``python -m harness budget SCENARIO``), each attempt the
  strategy's worker in a group of its own;
* :mod:`harness.budget.record`: ``budget.json``, versioned and read strictly; the report
  and the figure are :mod:`harness.report.budget`.
* SIGINT, SIGTERM and SIGHUP end a sweep through its cleanup, as they end a run
  (:mod:`harness.stopping`): no worker and no group outlives it; a SIGKILLed sweep's worker
  dies with it and its group goes at the next start.

Each attempt is a fresh process on a cold cache in a group of its own::

    def attempt(limit: int) -> Attempt:
        return run_in_group(worker_command, limit, timeout_s, cold_files=checkpoint_files)

    sweep = smallest_limit(attempt, lower=baseline_bytes, upper=machine_bytes,
                           precision_bytes=default_precision(model_bytes))
"""

from harness.budget.cgroup import DEFAULT_PREFIX, Attempt, MemoryGroup, remove_stale_groups, run_in_group
from harness.budget.controller import CgroupUnavailable, GroupReading, MemoryController, find_controller
from harness.budget.sweep import Sweep, SweepError, SweepPoint, default_precision, smallest_limit

__all__ = [
    "DEFAULT_PREFIX",
    "Attempt",
    "CgroupUnavailable",
    "GroupReading",
    "MemoryController",
    "MemoryGroup",
    "Sweep",
    "SweepError",
    "SweepPoint",
    "default_precision",
    "find_controller",
    "remove_stale_groups",
    "run_in_group",
    "smallest_limit",
]
