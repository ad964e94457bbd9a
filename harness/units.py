"""Binary units of bytes, declared once: every module of the harness that turns bytes into KiB, MiB, GiB, TiB
or PiB, or back, takes them from here (the reports show GiB; the budget's limits and messages, MiB).

No imports, so that every layer may use it.
"""

from __future__ import annotations

__all__ = ["GIB", "KIB", "MIB", "PIB", "TIB", "gib_or_mib"]

KIB = 1 << 10
"""Bytes in a KiB."""

MIB = 1 << 20
"""Bytes in a MiB."""

GIB = 1 << 30
"""Bytes in a GiB."""

TIB = 1 << 40
"""Bytes in a TiB."""

PIB = 1 << 50
"""Bytes in a PiB."""


def gib_or_mib(nbytes: int) -> str:
    """``nbytes`` as the budget's messages write a limit: ``"1.50 GiB"`` from a GiB up, ``"512 MiB"`` below."""
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB else f"{nbytes / MIB:.0f} MiB"
