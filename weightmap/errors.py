"""Exceptions raised by weightmap.

Every error about a checkpoint's content or a model/checkpoint mismatch is a
:class:`MappingError`, so callers can catch one type. Both derive from
:class:`ValueError`: the input was wrong, not the machine.

Failures of the machine stay :class:`OSError`, with the system's errno and so its
subclass (``FileNotFoundError``, ``PermissionError``, ``IsADirectoryError``, ...):
a file that cannot be opened, no space left while writing, a missing or read-only
directory. Those weightmap raises while writing name the target file (in the message
and in ``filename``), never a hidden temporary one.
"""

from __future__ import annotations

__all__ = ["HeaderError", "MappingError"]


class MappingError(ValueError):
    """Base error of weightmap: a checkpoint cannot be read, written or mapped as asked.

    The message names the file, the tensor (where there is one) and the rule broken,
    so that it can be acted on without a debugger.
    """


class HeaderError(MappingError):
    """The safetensors header (or a sharded index) breaks a rule of the format."""
