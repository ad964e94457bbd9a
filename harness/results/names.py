"""Results names the harness derives from others, and the names nothing else may take so that none collides.

Two kinds of names are made from other names: a budget sweep's results are ``<scenario>-budget``
unless given another name (:func:`budget_name`: ``results/<scenario>-budget/`` and
``<scenario>-budget.md``), and ``harness compare`` writes ``<base>-vs-<new>.md`` and ``.png``
(:func:`comparison_name`). A run named ``x-budget`` would be published where a sweep of ``x`` is, and
one named ``a-vs-b`` would have its report where the comparison of ``a`` and ``b`` goes, each
replacing the other. So a scenario's name and a run's results name never end in :data:`BUDGET_SUFFIX`
nor hold :data:`COMPARISON_JOIN`, and a sweep's results name never holds :data:`COMPARISON_JOIN`
(:func:`reserved_problem`).
"""

from __future__ import annotations

__all__ = ["BUDGET_SUFFIX", "COMPARISON_JOIN", "budget_name", "comparison_name", "reserved_problem"]

BUDGET_SUFFIX = "-budget"
"""Ends the default name of a budget sweep's results: ``<scenario>-budget``."""

COMPARISON_JOIN = "-vs-"
"""Joins the two results names a comparison's files are named after: ``<base>-vs-<new>``."""


def budget_name(scenario: str) -> str:
    """The default name of the results of a budget sweep of ``scenario``: ``<scenario>-budget``."""
    return f"{scenario}{BUDGET_SUFFIX}"


def comparison_name(base: str, new: str) -> str:
    """``<base>-vs-<new>``: the file name, without suffix, of the comparison of results ``base`` and ``new``."""
    return f"{base}{COMPARISON_JOIN}{new}"


def reserved_problem(name: str, *, sweep: bool = False) -> str | None:
    """Why ``name`` may not name a scenario or a run's results (``sweep``: a budget sweep's results, which may
    end in :data:`BUDGET_SUFFIX`): it could be a name derived from others; ``None`` when it may."""
    if COMPARISON_JOIN in name:
        return (f"{name!r} holds {COMPARISON_JOIN!r}, which only the files of a comparison "
                f"(<base>{COMPARISON_JOIN}<new>.md) are named with")
    if not sweep and name.endswith(BUDGET_SUFFIX):
        return (f"{name!r} ends in {BUDGET_SUFFIX!r}, which only a budget sweep's results "
                f"(<scenario>{BUDGET_SUFFIX}) are named with")
    return None
