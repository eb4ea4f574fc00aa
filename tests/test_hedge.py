"""The least-regret choice over uncertain cost models (``pace.hedge``, ``compile_trace``'s
``hedge``)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.compiler import compile_trace
from pace.errors import InputError
from pace.hedge import TIE, least_regret, regrets
from pace.ir import Interference, Trace
from pace.sim import schedule_policy, simulate
from pace.synth import random_trace
from tests.strategies import traces

_times = st.floats(1.0, 1e6, allow_nan=False)


@st.composite
def _matrices(draw: st.DrawFn) -> list[list[float]]:
    rows = draw(st.integers(1, 5))
    cols = draw(st.integers(1, 4))
    return [[draw(_times) for _ in range(cols)] for _ in range(rows)]


@given(_matrices())
def test_least_regret_is_the_minimax_choice(replays: list[list[float]]) -> None:
    worst = regrets(replays)
    assert all(w >= 0.0 for w in worst)
    # Under every model some candidate is the best there (regret 0 in that column).
    for m in range(len(replays[0])):
        best = min(row[m] for row in replays)
        assert any(row[m] == best for row in replays)
    pick = least_regret(replays)
    assert all(worst[pick] <= w + TIE for w in worst)
    # Earlier candidates were not within the tie of the least.
    assert all(worst[i] > min(worst) + TIE for i in range(pick))


@given(_matrices())
def test_a_candidate_best_under_every_model_is_chosen(replays: list[list[float]]) -> None:
    dominant = [min(row[m] for row in replays) * 0.5 for m in range(len(replays[0]))]
    assert least_regret([*replays, dominant]) in {
        i for i, w in enumerate(regrets([*replays, dominant])) if w <= TIE
    }
    assert least_regret([dominant, *replays]) == 0


def test_regrets_refuse_ragged_or_empty_matrices() -> None:
    with pytest.raises(InputError, match="one replay per model"):
        regrets([[1.0, 2.0], [1.0]])
    with pytest.raises(InputError, match="at least one"):
        regrets([])


def _with_loss(trace: Trace, us_per_byte: float) -> Trace:
    term = Interference(us_per_byte=us_per_byte, us_per_call=200.0, comm_stretch=0.05)
    return dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, interference=term))


def _worst_regret(schedules: list[object], models: list[Trace], which: int) -> float:
    replays = [
        [simulate(m, schedule_policy(s)).iteration_us for m in models]  # type: ignore[arg-type]
        for s in schedules
    ]
    return regrets(replays)[which]


@settings(max_examples=15, deadline=None)
@given(traces(max_layers=6), st.sampled_from([0.0, 2e-4, 1e-3, 4e-3]))
def test_the_hedged_schedule_loses_least_over_the_models(trace: Trace, loss: float) -> None:
    """Compiled under a low and a high compute loss, the hedged schedule's worst regret over
    the two models is no more than that of the schedule compiled under either one alone."""
    low, high = _with_loss(trace, loss), _with_loss(trace, 10 * loss + 1e-4)
    alone_low = compile_trace(low, baselines=False).schedule
    alone_high = compile_trace(high, baselines=False).schedule
    hedged = compile_trace(low, baselines=False, hedge=[high])
    models = [low, high]
    cands = [hedged.schedule, alone_low, alone_high]
    worst = _worst_regret(cands, models, 0)
    assert worst <= _worst_regret(cands, models, 1) + TIE + 1e-9
    assert worst <= _worst_regret(cands, models, 2) + TIE + 1e-9
    info = hedged.schedule.meta["hedge"]
    assert info["models"] == 2
    # The prediction is the shipped schedule's replay under the main model.
    assert hedged.predicted_iteration_us == pytest.approx(
        simulate(low, schedule_policy(hedged.schedule)).iteration_us, rel=1e-9
    )


def test_the_hedge_trades_a_little_under_one_model_for_more_under_the_other() -> None:
    """Found by search over seeds (again once the order search joined units: seed 35's trade
    was gone): compiled under the low loss alone, the schedule replays 147 us slower under the
    high loss than the one compiled there, which is only 23 us slower under the low loss;
    the hedge ships the latter."""
    base = random_trace(seed=102, n_layers=8, alpha_us=30.0)
    low, high = _with_loss(base, 5e-4), _with_loss(base, 1e-2)
    alone = compile_trace(low, baselines=False)
    hedged = compile_trace(low, baselines=False, hedge=[high])
    info = hedged.schedule.meta["hedge"]
    assert info["chosen"] == 1
    assert info["regret"][1] < info["regret"][0] - TIE
    # The trade: a little slower under the main model, less slow under the other.
    assert alone.predicted_iteration_us < hedged.predicted_iteration_us
    assert hedged.predicted_iteration_us < alone.predicted_iteration_us * 1.001
    high_us = [simulate(high, schedule_policy(r.schedule)).iteration_us for r in (alone, hedged)]
    assert high_us[1] < high_us[0] - 50.0


def test_a_hedge_with_the_same_model_keeps_the_schedule() -> None:
    trace = _with_loss(random_trace(seed=5, n_layers=8, alpha_us=30.0), 1e-3)
    plain = compile_trace(trace)
    hedged = compile_trace(trace, hedge=[trace])
    assert hedged.schedule.units == plain.schedule.units
    assert hedged.predicted_iteration_us == pytest.approx(plain.predicted_iteration_us)
    # The schedule compiled under the trace's own model (as compiled, or as searched).
    info = hedged.schedule.meta["hedge"]
    assert info["compiled_under"][info["chosen"]] == 0
    assert hedged.schedule.trace_digest == plain.schedule.trace_digest


def test_a_hedge_must_model_the_same_job() -> None:
    trace = random_trace(seed=5, n_layers=8)
    other = random_trace(seed=6, n_layers=8)
    with pytest.raises(InputError, match="only `comm` may differ"):
        compile_trace(trace, hedge=[other])
