"""Counted words for messages: "1 tensor is", "2 tensors are"."""

from __future__ import annotations

__all__ = ["SHOWN", "counted", "is_are", "names_shown"]


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """``n`` and the noun that agrees with it: ``counted(1, "tensor")`` is ``"1 tensor"``, 2 gives ``"2 tensors"``."""
    noun = singular if n == 1 else (plural if plural is not None else singular + "s")
    return f"{n:,} {noun}"


def is_are(n: int) -> str:
    """The verb that agrees with ``n`` things: ``"is"`` for one, ``"are"`` otherwise."""
    return "is" if n == 1 else "are"


SHOWN = 20
"""Names (or problems) a message lists; the rest are counted."""


def names_shown(names: list[str]) -> str:
    """The first :data:`SHOWN` names, quoted and comma-separated, then how many more there are."""
    shown = ", ".join(repr(name) for name in names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
