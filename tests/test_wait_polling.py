"""The runtime's wait for a collective: polls with sleeps in between, and a deadline."""

from __future__ import annotations

import itertools
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.runtime.backends import CollectiveTimeoutError, wait_polling


@settings(deadline=None, max_examples=30)
@given(polls=st.integers(1, 12))
def test_it_returns_on_the_first_poll_that_says_done(polls: int) -> None:
    seen = []

    def done() -> bool:
        seen.append(1)
        return len(seen) == polls

    wait_polling(done, math.inf)
    assert len(seen) == polls


@settings(deadline=None, max_examples=20)
@given(polls=st.integers(2, 12))
def test_it_sleeps_between_polls_with_a_doubling_pause(polls: int) -> None:
    """Between 20 us and 1 ms per pause, doubling: the pauses before the n-th poll sum to at
    least 20 us * (2^(n-1) - 1) (capped), so the thread gives its core away while waiting."""
    stamps: list[float] = []

    def done() -> bool:
        stamps.append(time.perf_counter())
        return len(stamps) == polls

    wait_polling(done, math.inf)
    pauses = [b - a for a, b in itertools.pairwise(stamps)]
    for i, pause in enumerate(pauses):
        assert pause >= min(1e-3, 20e-6 * 2**i) * 0.9  # sleep() never returns early


def test_a_deadline_passed_raises_with_the_time_waited() -> None:
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match=r"not finished after 0\.\d+ s"):
        wait_polling(lambda: False, t0 + 0.05)
    assert time.monotonic() - t0 < 1.0


def test_done_at_once_returns_even_past_the_deadline() -> None:
    wait_polling(lambda: True, time.monotonic() - 1.0)
