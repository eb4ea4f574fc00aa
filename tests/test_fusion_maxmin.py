"""MaxMinSize (PACE Alg. 1): iterative DP vs brute force, and bisection vs the DP."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pace.fusion.maxmin import (
    brute_force_max_min,
    group_sums,
    max_min_bisect,
    max_min_dp,
    max_min_table,
)

small_chains = st.lists(st.integers(1, 50), min_size=1, max_size=10)


def _check_partition(sizes: list[int], starts: np.ndarray, n_groups: int) -> None:
    assert len(starts) == n_groups
    assert starts[0] == 0
    assert np.all(np.diff(starts) > 0)
    assert starts[-1] < len(sizes)
    assert int(group_sums(sizes, starts).sum()) == sum(sizes)


@given(sizes=small_chains, data=st.data())
def test_dp_equals_brute_force(sizes: list[int], data: st.DataObject) -> None:
    r = data.draw(st.integers(1, len(sizes)))
    value, starts = max_min_dp(sizes, r)
    assert value == brute_force_max_min(sizes, r)
    _check_partition(sizes, starts, r)
    assert int(group_sums(sizes, starts).min()) == value


@given(sizes=small_chains)
def test_table_answers_every_r(sizes: list[int]) -> None:
    table = max_min_table(sizes)
    for r in range(1, len(sizes) + 1):
        assert int(table.value[r - 1, 0]) == brute_force_max_min(sizes, r)
        starts = table.partition(r)
        _check_partition(sizes, starts, r)
        assert int(group_sums(sizes, starts).min()) == int(table.value[r - 1, 0])


@given(sizes=st.lists(st.integers(1, 10**6), min_size=1, max_size=60), data=st.data())
def test_bisection_equals_dp(sizes: list[int], data: st.DataObject) -> None:
    r = data.draw(st.integers(1, len(sizes)))
    value, starts = max_min_bisect(sizes, r)
    assert value == max_min_dp(sizes, r)[0]
    _check_partition(sizes, starts, r)
    assert int(group_sums(sizes, starts).min()) == value


def test_bisection_vector_path_equals_dp() -> None:
    # More than 256 groups takes the pointer-doubling count instead of the scalar scan.
    rng = np.random.default_rng(7)
    sizes = [int(x) for x in rng.integers(1, 5000, size=400)]
    table = max_min_table(sizes)
    for r in (1, 2, 255, 256, 257, 300, 399, 400):
        value, starts = max_min_bisect(sizes, r)
        assert value == int(table.value[r - 1, 0])
        _check_partition(sizes, starts, r)


def test_paper_tie_break_is_shortest_first_group() -> None:
    # [3, 1, 3] into 2: {3}|{1, 3} and {3, 1}|{3} both have min 3; Alg. 1's strict `<` keeps the
    # first (shortest) first group.
    value, starts = max_min_dp([3, 1, 3], 2)
    assert value == 3
    assert starts.tolist() == [0, 1]
    value, starts = max_min_dp([2, 1, 1, 5], 2)
    assert value == 4
    assert starts.tolist() == [0, 3]


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="n_groups"):
        max_min_dp([1, 2], 3)
    with pytest.raises(ValueError, match="positive"):
        max_min_bisect([1, 0], 1)


@given(sizes=st.lists(st.integers(1, 10**4), min_size=1, max_size=40), data=st.data())
def test_bisection_with_any_bracket_equals_dp(sizes: list[int], data: st.DataObject) -> None:
    # The sweep passes neighbours' values as a bracket; even a wrong one must not change the answer.
    r = data.draw(st.integers(1, len(sizes)))
    lo = data.draw(st.integers(1, sum(sizes)))
    hi = data.draw(st.integers(1, sum(sizes)))
    value, starts = max_min_bisect(sizes, r, bracket=(lo, hi))
    assert value == max_min_dp(sizes, r)[0]
    _check_partition(sizes, starts, r)
    assert int(group_sums(sizes, starts).min()) == value
