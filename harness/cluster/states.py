"""What a Slurm job's state means to the harness: done, retry, or a failed attempt with its reason.

Slurm's base states (``sacct``/``scontrol``'s ``JobState``, a suffix such as ``CANCELLED by 0`` dropped) fall
into: still going (:data:`PENDING_STATES`), ended with the command's own result to read (``COMPLETED``,
``FAILED``), ended for memory (``OUT_OF_MEMORY``: a budget attempt that failed for memory, not an error), lost by
the cluster and worth running again (:data:`RETRY_STATES`: preempted, a node failed or did not boot, requeued),
and ended by someone or something else (:data:`ENDED_STATES`: cancelled, timed out, past its deadline), which is
a failed attempt whose reason says so. A state this module does not know is a failed attempt naming it, never a
silent hole.
"""

from __future__ import annotations

import enum

__all__ = ["ENDED_STATES", "PENDING_STATES", "RETRY_STATES", "Outcome", "base_state", "describe", "outcome"]


class Outcome(enum.Enum):
    """What the harness does with a job in some state."""

    WAIT = "wait"
    """Not ended: poll again."""
    RAN = "ran"
    """The command ran to its end (status 0 or not): read its own result."""
    OUT_OF_MEMORY = "out_of_memory"
    """Slurm ended it for memory: the attempt failed for memory."""
    RETRY = "retry"
    """The cluster lost it (preempted, node lost): submit it again."""
    ENDED = "ended"
    """Ended from outside (cancelled, timed out): a failed attempt with the reason."""


PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING",
                            "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SIGNALING", "STAGE_OUT", "STOPPED"})
RETRY_STATES = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "REQUEUED"})
ENDED_STATES = frozenset({"CANCELLED", "TIMEOUT", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})

_WHY = {
    "OUT_OF_MEMORY": "Slurm ended the job for memory (OUT_OF_MEMORY)",
    "PREEMPTED": "the job was preempted (PREEMPTED)",
    "NODE_FAIL": "the job's node failed (NODE_FAIL)",
    "BOOT_FAIL": "the job's node failed to boot (BOOT_FAIL)",
    "REQUEUED": "the job was requeued (REQUEUED)",
    "CANCELLED": "the job was cancelled (CANCELLED)",
    "TIMEOUT": "the job reached its time limit (TIMEOUT)",
    "DEADLINE": "the job reached its deadline (DEADLINE)",
    "REVOKED": "the job was revoked (REVOKED)",
    "SPECIAL_EXIT": "the job ended in SPECIAL_EXIT",
}


def base_state(state: str) -> str:
    """``CANCELLED by 0`` -> ``CANCELLED``; ``COMPLETED+`` -> ``COMPLETED``."""
    return state.strip().split()[0].rstrip("+").upper() if state.strip() else ""


def outcome(state: str) -> Outcome:
    """What ``state`` (Slurm's ``JobState``) means; an unknown one is :attr:`Outcome.ENDED`."""
    base = base_state(state)
    if base in PENDING_STATES:
        return Outcome.WAIT
    if base in ("COMPLETED", "FAILED"):
        return Outcome.RAN
    if base == "OUT_OF_MEMORY":
        return Outcome.OUT_OF_MEMORY
    if base in RETRY_STATES:
        return Outcome.RETRY
    return Outcome.ENDED


def describe(state: str, reason: str | None = None) -> str:
    """A failed attempt's reason for ``state``, with Slurm's own ``Reason`` where it gives one."""
    base = base_state(state)
    text = _WHY.get(base, f"the job ended in state {state.strip() or 'unknown'}")
    if reason and reason not in ("None", "(null)"):
        text += f"; Slurm's reason: {reason}"
    return text
