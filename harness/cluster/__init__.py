"""Running the harness's processes as Slurm jobs: budget attempts whose limit is the job's ``--mem``, and a run's
workers (each strategy's run of each round) under the scenario's memory limit.

* :mod:`harness.scenario_cluster` (in the scenario's layer): :class:`ClusterSettings`, a scenario's
  ``[cluster]`` table (partition, account, time, GPUs, extra ``sbatch`` options) and the ``--executor`` choices.
* :mod:`harness.cluster.states`: what each Slurm job state means to the harness (:func:`outcome`):
  ``OUT_OF_MEMORY`` is an attempt that failed for memory, ``PREEMPTED`` and ``NODE_FAIL`` are retried,
  ``CANCELLED`` and ``TIMEOUT`` are failed attempts with the reason.
* :mod:`harness.cluster.slurm`: :class:`SlurmClient` submits (``sbatch``), polls all its jobs at once (one
  ``squeue``), reads a job's end (``scontrol``, then ``sacct`` once the controller forgot it) and cancels
  (``scancel``) by job id; it keeps every job id it submitted so that an interrupted sweep cancels them all.
  :func:`~harness.cluster.slurm.submit_until_kept` is the one submit-wait-resubmit loop of attempts and runs.
* :mod:`harness.cluster.attempt`: the job's side: one command in the harness's own memory cgroup, the result
  written where the submitter reads it, with the node and which limit was the enforcer.
* :mod:`harness.cluster.executor`: :class:`SlurmAttempts`, one budget attempt as one Slurm job, retried where
  the cluster lost it, returned as the :class:`~harness.budget.cgroup.Attempt` a local attempt returns.
* :mod:`harness.cluster.run_job`: the job's side of a run's worker: the worker watched as a local one is
  (:func:`harness.watch.watch`), how it ended written where the submitter reads it, with the node and the enforcer.
* :mod:`harness.cluster.runs`: :class:`~harness.cluster.runs.SlurmRuns`, one worker run as one Slurm job (``run
  --executor slurm``), returned as the :class:`~harness.watch.Outcome` a local worker's watcher returns.
* :mod:`harness.cluster.matrix`: ``sweep``'s matrix of scenarios (budget sweeps, or runs with ``--mode run``) and
  its summary.

Slurm is driven through ``sbatch``, ``squeue``, ``scontrol``, ``sacct`` and ``scancel`` directly rather than
``submitit``: an attempt's job runs one command the harness already has (the worker's command line), the limit must be
Slurm's own ``--mem`` with the job's real state (``OUT_OF_MEMORY``, ``TIMEOUT``, ``PREEMPTED``) read back,
and ``submitit``'s pickled callables and its own requeue handling would stand between the harness and both;
it would also be one more dependency where five commands the cluster already has do.
"""

from harness.scenario_cluster import EXECUTORS, ClusterSettings

__all__ = ["EXECUTORS", "ClusterSettings"]
