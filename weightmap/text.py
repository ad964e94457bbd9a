"""Counted words for messages: "1 tensor is", "2 tensors are"."""

from __future__ import annotations

__all__ = ["counted", "is_are"]


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """``n`` and the noun that agrees with it: ``counted(1, "tensor")`` is ``"1 tensor"``, 2 gives ``"2 tensors"``."""
    noun = singular if n == 1 else (plural if plural is not None else singular + "s")
    return f"{n:,} {noun}"


def is_are(n: int) -> str:
    """The verb that agrees with ``n`` things: ``"is"`` for one, ``"are"`` otherwise."""
    return "is" if n == 1 else "are"
