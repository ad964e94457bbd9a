"""Signals as a terminal leaves them, for tests that send SIGINT, SIGTERM or SIGHUP to their own process."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from harness import stopping


@pytest.fixture(autouse=True)
def terminal_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP as a terminal leaves them, whatever the test runner inherited (a background
    job starts with SIGINT ignored, ``nohup`` with SIGHUP ignored, and an ignored signal stays ignored).
    Imported into a test module, it applies to each of its tests."""
    before = {s: signal.getsignal(s) for s in stopping.STOP_SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
