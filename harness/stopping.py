"""How a signal stops a run or a budget sweep: one mechanism for both, and the error that says so.

A run (:func:`harness.run.run_scenario`) and a sweep (:func:`harness.budget.mode.run_budget`) own
processes (each strategy's worker, each attempt's) and, for a sweep, memory cgroups. Left to their
default action, SIGTERM and SIGHUP would end the parent at once and leave both behind. Within
:func:`raising`, each of :data:`STOP_SIGNALS` instead raises :class:`Interrupted` in the main thread,
so that every ``with`` block and ``finally`` on the way out stops what it started and removes what it
made; the caller turns it into :class:`RunInterrupted` at the top (:meth:`Interrupted.error`), which
``python -m harness`` prints as one ``error:`` line, exiting with 128 + the signal's number.

The rules, the same for a run and a sweep:

* A signal outside any section below is raised at once (a reference measurement included: a signal
  is not its failure).
* Within :func:`deferred` (making a memory group and registering it for removal, starting a process
  inside it, removing it; watching a worker), a signal is recorded and raised when the outermost
  section ends, however it ends; code that can stop its own work sooner asks :func:`pending` (the
  run's watcher stops its worker, then raises).
* After :func:`finishing` (publishing the results), a signal is recorded and never raised: the run
  ends as it is, published, rather than half published or said to be unchanged when it is not.
* Only the first signal is raised. One that arrives while the first one's :class:`Interrupted` is
  on its way out (the cleanup runs) is not raised: the cleanup is not cut short, and the first one
  already ends the run. One that arrives after the first was swallowed (code that took what it
  raised and went on) is raised as the first was, never ignored; and :func:`check`, where the run
  goes on, raises a signal caught before, swallowed or not.
* A signal the parent was started with ignored (SIGHUP under ``nohup``, SIGINT in a background
  job) stays ignored.

SIGKILL cannot be caught: there, each worker dies with its parent (:func:`die_with_parent`; the
budget's wrapper sets the same), and the next start removes what the dead run left (its staging
directory, its memory groups).
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from harness.errors import HarnessError

__all__ = ["STOP_SIGNALS", "Interrupted", "RunInterrupted", "check", "deferred", "die_with_parent", "finishing",
           "pending", "raising"]

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a run and a budget sweep: their workers are stopped first, then one ``error:`` line."""


class RunInterrupted(HarnessError):
    """SIGINT, SIGTERM or SIGHUP reached the parent; the running worker was stopped. ``signum`` says which."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


class Interrupted(BaseException):
    """A caught signal (``signum``) on its way to the top of a run or a sweep.

    A :class:`BaseException`, as :class:`KeyboardInterrupt` is, so that no ``except Exception``
    between the signal and the top swallows it. ``detail`` says what was stopped on the way
    (``the running strategy's process was stopped (map)``); code that knows more adds to it.
    """

    def __init__(self, signum: int, detail: str = "") -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.detail = detail

    def error(self, outcome: str) -> RunInterrupted:
        """``interrupted by SIGTERM; <detail>; <outcome>`` as the error the caller raises at the top."""
        parts = [f"interrupted by {signal.Signals(self.signum).name}", self.detail, outcome]
        return RunInterrupted("; ".join(part for part in parts if part), self.signum)


class _State:
    def __init__(self) -> None:
        self.active = False  # within raising()
        self.depth = 0  # deferred() sections open
        self.finishing = False  # after finishing()
        self.signum: int | None = None  # the signal caught, once one is


_state = _State()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _on_its_way_out() -> bool:
    """Whether an :class:`Interrupted` is being handled now (a ``finally``, an ``except``, an ``__exit__`` on
    its way out), directly or as the context of what is."""
    exc: BaseException | None = sys.exc_info()[1]
    while exc is not None:
        if isinstance(exc, Interrupted):
            return True
        exc = exc.__context__
    return False


def _handler(signum: int, frame: FrameType | None) -> None:
    if _state.depth or _state.finishing or _on_its_way_out():
        if _state.signum is None:
            _state.signum = signum
        return
    _state.signum = signum
    raise Interrupted(signum)


def pending() -> int | None:
    """The signal caught within :func:`raising` (None before one is, and outside it)."""
    return _state.signum if _state.active else None


def check() -> None:
    """Raise :class:`Interrupted` for a signal caught before, even one raised and swallowed since.

    Nothing outside :func:`raising` or after :func:`finishing`.
    """
    if _state.active and not _state.finishing and _state.signum is not None:
        raise Interrupted(_state.signum)


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
        if _state.depth == 0 and not _on_its_way_out():
            check()


def finishing() -> None:
    """From here until :func:`raising` ends (publishing the results): a signal caught before is raised now;
    one that arrives later is recorded, never raised."""
    check()
    _state.finishing = _state.active


@contextlib.contextmanager
def raising() -> Iterator[None]:
    """Within: SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` in the main thread (see the module).

    The handlers before it are put back on the way out; a signal caught in a :func:`deferred` section at
    the very end is raised then. Outside the main thread (no signal handler can be installed there) and
    inside another :func:`raising` it changes nothing.
    """
    if not _main_thread() or _state.active:
        yield
        return
    _state.depth, _state.signum, _state.finishing = 0, None, False
    previous: dict[signal.Signals, Any] = {}
    for number in STOP_SIGNALS:
        if signal.getsignal(number) is not signal.SIG_IGN:
            previous[number] = signal.signal(number, _handler)
    _state.active = True
    try:
        yield
        check()
    finally:
        _state.active = False
        for number, old in previous.items():
            signal.signal(number, old)


def die_with_parent() -> None:
    """In a child process, before exec (``preexec_fn``): SIGKILL when its parent dies (Linux
    ``PR_SET_PDEATHSIG``), so that no process of a run outlives the one that started it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
