"""How a signal stops a run or a budget sweep: which signals, and the error that says so.

Both :func:`harness.run.run_scenario` and :func:`harness.budget.mode.run_budget` stop their
running worker first on one of :data:`STOP_SIGNALS`, then raise :class:`RunInterrupted`;
``python -m harness`` prints it as one ``error:`` line and exits with 128 + the signal's number.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal

from harness.errors import HarnessError

__all__ = ["STOP_SIGNALS", "RunInterrupted", "die_with_parent"]

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a run (and a budget sweep): its workers are stopped first, then one ``error:`` line."""


class RunInterrupted(HarnessError):
    """SIGINT, SIGTERM or SIGHUP reached the parent; the running worker was stopped. ``signum`` says which."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


def die_with_parent() -> None:
    """In a child process, before exec (``preexec_fn``): SIGKILL when its parent dies (Linux
    ``PR_SET_PDEATHSIG``), so that no process of a run outlives the one that started it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
