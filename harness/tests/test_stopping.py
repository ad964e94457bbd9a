"""The one mechanism by which a signal stops a run or a budget sweep (:mod:`harness.stopping`).

What it does to a whole run or sweep is tested end to end beside them: ``test_staging`` and ``test_cli``
(a run), ``test_budget_signals`` and ``test_budget_mode`` (a sweep).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from harness import stopping
from harness.stopping import Interrupted
from harness.tests.terminal import terminal_signals  # noqa: F401 (autouse: each test starts from a terminal's signals)


def send(signum: int, wait_s: float = 10.0) -> None:
    """``signum`` to this process; the handler runs between two bytecodes of the main thread, and what it raises
    ends the wait at once."""
    os.kill(os.getpid(), signum)
    time.sleep(wait_s)


def test_a_signal_raises_interrupted_and_the_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as info, stopping.raising():
        send(signal.SIGTERM)
        pytest.fail("SIGTERM was not raised")
    assert info.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_error_at_the_top_names_the_signal_what_was_stopped_and_the_outcome() -> None:
    error = Interrupted(signal.SIGHUP, "the running strategy's process was stopped (map)").error("out is unchanged")
    assert str(error) == "interrupted by SIGHUP; the running strategy's process was stopped (map); out is unchanged"
    assert error.signum == signal.SIGHUP
    assert str(Interrupted(signal.SIGINT).error("out is unchanged")) == "interrupted by SIGINT; out is unchanged"


def test_a_signal_in_a_deferred_section_is_raised_when_the_outermost_section_ends() -> None:
    done = []
    with pytest.raises(Interrupted) as info, stopping.raising():
        with stopping.deferred():
            send(signal.SIGHUP, 0.05)
            assert stopping.pending() == signal.SIGHUP  # for code that can stop its own work sooner
            with stopping.deferred():
                time.sleep(0.05)
            done.append("the section ran to its end")
            send(signal.SIGTERM, 0.05)  # a second signal while the first waits: not raised again
        done.append("not reached")
    assert done == ["the section ran to its end"]
    assert info.value.signum == signal.SIGHUP


def test_a_deferred_section_ended_by_an_error_raises_the_signal_it_held() -> None:
    with pytest.raises(Interrupted) as info, stopping.raising(), stopping.deferred():
        send(signal.SIGTERM, 0.05)
        raise OSError("the section failed")
    assert isinstance(info.value.__context__, OSError)


def test_an_ignored_signal_stays_ignored() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with stopping.raising():
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        send(signal.SIGHUP, 0.05)
        assert stopping.pending() is None


def test_a_signal_during_the_cleanup_does_not_cut_it_short() -> None:
    cleaned = []
    with pytest.raises(Interrupted) as info, stopping.raising():
        try:
            send(signal.SIGTERM)
        finally:  # the first signal's Interrupted on its way out: a second one waits
            send(signal.SIGHUP, 0.05)
            cleaned.append("the cleanup ran to its end")
    assert cleaned == ["the cleanup ran to its end"]
    assert info.value.signum == signal.SIGTERM


def test_a_second_signal_is_raised_as_the_first_was_once_the_first_was_swallowed() -> None:
    with pytest.raises(Interrupted) as last, stopping.raising():
        with pytest.raises(Interrupted):
            send(signal.SIGINT)
        # swallowed, as code on the way could: the next signal still stops the run
        with pytest.raises(Interrupted) as second:
            send(signal.SIGTERM)
        assert second.value.signum == signal.SIGTERM
        with pytest.raises(Interrupted) as again:
            stopping.check()  # and the run, wherever it goes on, stops there
        assert again.value.signum == signal.SIGTERM
        with stopping.deferred():
            pass  # ... the end of a section among those places
        pytest.fail("the signal caught before was forgotten")
    assert last.value.signum == signal.SIGTERM


def test_a_signal_caught_before_publishing_is_raised_as_it_begins() -> None:
    with pytest.raises(Interrupted), stopping.raising():
        with pytest.raises(Interrupted):
            send(signal.SIGTERM)
        stopping.finishing()
        pytest.fail("published after a signal")


def test_a_signal_once_finishing_is_recorded_and_not_raised() -> None:
    with stopping.raising():
        stopping.finishing()
        send(signal.SIGTERM, 0.05)
        with stopping.deferred():
            pass
        stopping.check()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_outside_raising_nothing_is_caught_or_raised() -> None:
    with stopping.deferred():
        assert stopping.pending() is None
    stopping.check()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
