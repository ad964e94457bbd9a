"""Results names the harness derives from others, and the names nothing else may take so that none collides.

Two kinds of names are made from other names: a budget sweep's results are ``<scenario>-budget``
unless given another name (:func:`budget_name`: ``results/<scenario>-budget/`` and
``<scenario>-budget.md``), and ``harness compare`` writes ``<base>-vs-<new>.md`` and ``.png``
(:func:`comparison_name`). A strategy swept on its own is named ``<scenario>-budget-<strategy>``
(``--name pi05-budget-stream``), beside the scenario's sweep. A run named ``x-budget`` or
``x-budget-stream`` would be published where a sweep is, and one named ``a-vs-b`` would have its
report where the comparison of ``a`` and ``b`` goes, each replacing the other. So the names of runs
and of sweeps never meet: a scenario's name and a run's results name never end in :data:`BUDGET_SUFFIX`
nor hold it followed by ``-`` (:func:`is_budget_name`), a sweep's results name always does, and
neither holds :data:`COMPARISON_JOIN` (:func:`reserved_problem`).
"""

from __future__ import annotations

__all__ = ["BUDGET_SUFFIX", "COMPARISON_JOIN", "budget_name", "comparison_name", "is_budget_name",
           "reserved_problem"]

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


def is_budget_name(name: str) -> bool:
    """Whether ``name`` is a budget sweep's: it ends in :data:`BUDGET_SUFFIX` (``<scenario>-budget``) or holds it
    followed by ``-`` (``<scenario>-budget-<strategy>``, a strategy swept on its own)."""
    return name.endswith(BUDGET_SUFFIX) or f"{BUDGET_SUFFIX}-" in name


def reserved_problem(name: str, *, sweep: bool = False) -> str | None:
    """Why ``name`` may not name a scenario or a run's results, or, with ``sweep``, a budget sweep's results
    (which must be a budget name, :func:`is_budget_name`): it could be a name of the other kind, or one
    derived from others; ``None`` when it may."""
    if COMPARISON_JOIN in name:
        return (f"{name!r} holds {COMPARISON_JOIN!r}, which only the files of a comparison "
                f"(<base>{COMPARISON_JOIN}<new>.md) are named with")
    if sweep and not is_budget_name(name):
        return (f"{name!r} is a run's name: a budget sweep's results end in {BUDGET_SUFFIX!r} or hold "
                f"{BUDGET_SUFFIX + '-'!r} (<scenario>{BUDGET_SUFFIX}, <scenario>{BUDGET_SUFFIX}-<strategy>), "
                "so that they never replace a run's")
    if not sweep and name.endswith(BUDGET_SUFFIX):
        return (f"{name!r} ends in {BUDGET_SUFFIX!r}, which only a budget sweep's results "
                f"(<scenario>{BUDGET_SUFFIX}) are named with")
    if not sweep and is_budget_name(name):
        return (f"{name!r} holds {BUDGET_SUFFIX + '-'!r}, which only a budget sweep's results of one strategy "
                f"(<scenario>{BUDGET_SUFFIX}-<strategy>) are named with")
    return None
