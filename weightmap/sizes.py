"""Sizes as people write them (``"5GB"``, ``"500MiB"``), as transformers' ``max_shard_size`` takes them; no torch."""

from __future__ import annotations

import math

__all__ = ["parse_size"]

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """Bytes from ``"2GB"``, ``"500MiB"``, ``"1e9"`` or ``"123"``; anything else is a ``ValueError``.

    Decimal units (KB, MB, GB, TB) are powers of 1000 and binary ones (KiB, MiB, GiB, TiB) of 1024, as
    transformers reads them; case and spaces do not matter. The result is at least one byte.
    """
    raw = text.strip().upper().replace(" ", "")
    number = raw.rstrip("KMGTIB")
    unit = raw[len(number):]
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except (KeyError, ValueError):
        raise ValueError(f"{text!r} is not a size: use bytes or a number with KB, MB, GB, KiB, MiB or GiB") from None
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"{text!r} is not a size of at least one byte")
    return int(value)
