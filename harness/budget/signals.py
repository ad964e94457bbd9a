"""Signals that end a budget sweep, turned into an exception so that its cleanup runs first.

A sweep owns processes (each attempt's worker) and memory cgroups (each attempt's group).
Left to their default action, SIGTERM and SIGHUP would end the parent at once and leave
both behind: the worker orphaned, with no timeout, in a group nobody removes. Within
:func:`raising`, SIGINT, SIGTERM and SIGHUP instead raise :class:`Interrupted` in the main
thread, so that every ``with`` block on the way out (each group's
:meth:`~harness.budget.cgroup.MemoryGroup.create`) kills what it started and removes what it
made. Code that must not be cut in two (making a group and registering it for removal,
starting a process inside it, removing it) runs under :func:`deferred`: a signal that arrives
there is raised when the section ends. Only the first signal is raised; later ones, while
the cleanup runs, are ignored. A signal the parent was started with ignored (SIGHUP under
``nohup``, SIGINT in a background job) stays ignored.

SIGKILL cannot be caught: there, each worker dies with its parent (``PR_SET_PDEATHSIG``, set by
the wrapper that starts it, :mod:`harness.budget.cgroup`) and the next sweep removes the groups
of the dead run (:func:`~harness.budget.cgroup.remove_stale_groups`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from harness.stopping import STOP_SIGNALS

__all__ = ["CAUGHT", "Interrupted", "deferred", "raising"]

CAUGHT: tuple[signal.Signals, ...] = STOP_SIGNALS
"""The signals :func:`raising` turns into :class:`Interrupted` (those that stop a run too)."""


class Interrupted(BaseException):
    """A caught signal (``signum``) ends the sweep.

    A :class:`BaseException`, as :class:`KeyboardInterrupt` is, so that no ``except Exception``
    between the signal and the top of the sweep swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _State:
    def __init__(self) -> None:
        self.active = False
        self.depth = 0
        self.signum: int | None = None
        self.raised = False


_state = _State()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_pending() -> None:
    if _state.active and _state.depth == 0 and _state.signum is not None and not _state.raised:
        _state.raised = True
        raise Interrupted(_state.signum)


def _handler(signum: int, frame: FrameType | None) -> None:
    if _state.signum is None:
        _state.signum = signum
    _raise_pending()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A section a caught signal does not cut short: it is raised when the (outermost) section ends.

    Outside the main thread, or outside :func:`raising`, it changes nothing.
    """
    if not _main_thread():
        yield
        return
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        _raise_pending()


@contextlib.contextmanager
def raising() -> Iterator[None]:
    """Within: SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` in the main thread (see the module).

    The handlers before it are put back on the way out. Outside the main thread (no signal
    handler can be installed there) and inside another :func:`raising` it changes nothing.
    """
    if not _main_thread() or _state.active:
        yield
        return
    _state.depth, _state.signum, _state.raised = 0, None, False
    previous: dict[signal.Signals, Any] = {}
    for number in CAUGHT:
        if signal.getsignal(number) is not signal.SIG_IGN:
            previous[number] = signal.signal(number, _handler)
    _state.active = True
    try:
        yield
    finally:
        _state.active = False
        for number, old in previous.items():
            signal.signal(number, old)
    if _state.signum is not None and not _state.raised:  # caught in a deferred section at the very end
        _state.raised = True
        raise Interrupted(_state.signum)
