"""Units of bytes and their text, declared once: every module of the harness that turns bytes into KiB, MiB,
GiB, TiB or PiB, or back, or a rate into MB/s, takes the unit and its formatter from here (the reports show
GiB; the budget's limits and messages, MiB; disk rates, decimal MB/s as disk makers and ``dd`` give them).

No imports, so that every layer may use it.
"""

from __future__ import annotations

__all__ = ["DASH", "GIB", "KIB", "MB", "MIB", "PIB", "TIB", "format_bytes", "format_gib", "format_gib_figure",
           "format_mb_per_s", "format_mib", "format_size", "gib_number", "gib_or_mib"]

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

MB = 1_000_000
"""Bytes in a (decimal) MB: disk rates are given in MB/s."""

DASH = "—"
"""What a missing value shows as."""


def gib_or_mib(nbytes: int | None) -> str:
    """``nbytes`` as the budget's messages write a limit: ``"1.50 GiB"`` from a GiB up, ``"512 MiB"`` below;
    ``None`` (not known) as ``"?"``."""
    if nbytes is None:
        return "?"
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB else f"{nbytes / MIB:.0f} MiB"


def format_gib(value: int | float | None, decimals: int = 2) -> str:
    """``value`` bytes as ``"1.23 GiB"``; ``None`` as a dash."""
    if value is None:
        return DASH
    return f"{value / GIB:.{decimals}f} GiB"


def gib_number(value: int, decimals: int = 3) -> str:
    """``value`` bytes as a bare number of GiB, ``"1.234"``, for a table whose header states the unit."""
    return f"{value / GIB:.{decimals}f}"


def format_gib_figure(gib: float | None) -> str:
    """A figure already in GiB (a reference's, as given) as ``"1.5 GiB"``, its digits as given; ``None`` as a dash."""
    return DASH if gib is None else f"{gib:g} GiB"


def format_mib(value: int | None, decimals: int = 1) -> str:
    """``value`` bytes as ``"1,234.5 MiB"``, a minus sign only where the rounded figure is below zero (never
    ``-0.0``); ``None`` as a dash."""
    if value is None:
        return DASH
    shown = round(value / MIB, decimals)
    return f"{shown + 0.0:,.{decimals}f} MiB"


def format_bytes(value: int) -> str:
    """A byte count in the largest binary unit that keeps it at 1 or more: ``"3.0 KiB"``, ``"12 bytes"``."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} bytes"


def format_size(nbytes: int) -> str:
    """A model's size in a message: ``"1.5 TiB"``, ``"3.2 GiB"`` (three digits), or ``"1,024 bytes"`` below a GiB."""
    if nbytes >= TIB:
        return f"{nbytes / TIB:.3g} TiB"
    return f"{nbytes / GIB:.3g} GiB" if nbytes >= GIB else f"{nbytes:,} bytes"


def format_mb_per_s(rate: float) -> str:
    """Bytes per second as ``"1234 MB/s"`` (decimal MB, no decimals)."""
    return f"{rate / MB:.0f} MB/s"
