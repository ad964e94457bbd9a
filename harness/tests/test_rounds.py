"""The order of the strategies in each measured round: the scenario's first, then changed so that no strategy
always follows, or always starts after the disk read, the same way."""

from __future__ import annotations

import pytest

from harness.rounds import round_order, round_orders


def _names(n: int) -> list[str]:
    return [f"s{i}" for i in range(n)]


@pytest.mark.parametrize("n", range(1, 11))
def test_round_zero_is_the_scenarios_order_and_every_round_runs_each_strategy_once(n: int) -> None:
    names = _names(n)
    assert round_order(names, 0) == tuple(names)
    for order in round_orders(names, 3 * n):
        assert sorted(order) == sorted(names)


@pytest.mark.parametrize("n", range(2, 11))
def test_no_strategy_follows_the_same_one_twice_or_starts_twice_within_a_window(n: int) -> None:
    names = _names(n)
    window = n if n % 2 == 0 else n - 1  # an odd count's design needs 2n rounds for every pair
    for start in range(2 * n):  # every window, wherever it starts: the design repeats
        orders = round_orders(names, start + window)[start:]
        after: dict[str, list[str]] = {name: [] for name in names}
        for order in orders:
            for before, name in zip(order, order[1:], strict=False):
                after[name].append(before)
        assert all(len(set(v)) == len(v) for v in after.values()), (start, orders)
        firsts = [order[0] for order in orders]
        assert len(set(firsts)) == len(firsts), (start, orders)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_with_an_even_count_every_strategy_follows_every_other_once_in_n_rounds(n: int) -> None:
    names = _names(n)
    pairs = [(a, b) for order in round_orders(names, n) for a, b in zip(order, order[1:], strict=False)]
    assert sorted(pairs) == sorted((a, b) for a in names for b in names if a != b)


def test_rounds_count_from_zero() -> None:
    with pytest.raises(ValueError, match="rounds count from 0"):
        round_order(["a", "b"], -1)
