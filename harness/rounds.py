"""The order a run's strategies take in each measured round.

A strategy's time can depend on what ran just before it (on a machine whose host backs its memory
again after it is freed, the run after one that freed GiBs meets other memory than the run after one
that freed little; the results' notes say where it did). Run in one fixed order every round, each
strategy always follows the same one, and that neighbour's effect reads as the strategy's own, the
same in every round and so inside its interval.

:func:`round_order` changes the order from round to round after a Williams design, the
crossover design balanced for what the previous treatment leaves behind: round 0 runs the
scenario's order, and over any ``n`` consecutive rounds of ``n`` strategies (``n - 1`` where
``n`` is odd) no strategy follows the same one twice, nor is first twice. For an even ``n`` every
strategy follows every other exactly once in ``n`` rounds; for an odd ``n``, twice in ``2n``.
Each round starts after the round's cold read of the checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["round_order", "round_orders"]


def _first_row(n: int) -> list[int]:
    """Williams' first row: 0, 1, n-1, 2, n-2, ..., whose steps between neighbours are all different mod n."""
    return [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]


def _rows(n: int) -> list[list[int]]:
    """The design's rows: the first row shifted by 0..n-1 (mod n); for an odd ``n`` each followed by its mirror."""
    shifted = [[(t + r) % n for t in _first_row(n)] for r in range(n)]
    if n % 2 == 0:
        return shifted
    return [row for r in shifted for row in (r, r[::-1])]


def round_order(strategies: Sequence[str], index: int) -> tuple[str, ...]:
    """The order in which round ``index`` (from 0) runs ``strategies``; round 0 runs them as given."""
    if index < 0:
        raise ValueError(f"round {index}: rounds count from 0")
    n = len(strategies)
    if n <= 1:
        return tuple(strategies)
    first = _first_row(n)
    position = {treatment: j for j, treatment in enumerate(first)}  # relabelled: row 0 is the given order
    rows = _rows(n)
    return tuple(strategies[position[t]] for t in rows[index % len(rows)])


def round_orders(strategies: Sequence[str], rounds: int) -> tuple[tuple[str, ...], ...]:
    """:func:`round_order` of rounds 0 to ``rounds - 1``."""
    return tuple(round_order(strategies, r) for r in range(rounds))
