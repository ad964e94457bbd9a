"""Whether a process the tests started (or had started) is still running."""

from __future__ import annotations

import time

import psutil


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a process that exited but was not reaped (a zombie) does not."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def gone_within(pid: int, seconds: float = 5.0) -> bool:
    """Whether ``pid`` stops running within ``seconds``."""
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)
