"""The one base class of every error a user of the harness can cause.

``python -m harness`` prints a :class:`HarnessError` as one line, ``error: <message>``,
and exits with status 2; anything else is a bug and keeps its traceback. Each
subclass lives beside the code that raises it (:class:`~harness.scenario.ScenarioError`,
:class:`~harness.fileio.codec.RecordError`, ...); the ones without a better home are here.
A message names the file and the key or path that is wrong, and what to do about it.
"""

from __future__ import annotations

__all__ = ["HarnessError", "OutputError", "PlanError"]


class HarnessError(Exception):
    """Something the user can fix: a bad scenario, a missing file, an unwritable results root."""


class OutputError(HarnessError, OSError):
    """Results cannot be written where they were asked for (read-only, a file, a full disk)."""


class PlanError(HarnessError, ValueError):
    """A valid scenario that cannot be run as asked with this model (too few weight units, say)."""
