"""Bayesian optimisation of the baselines' knobs (scikit-optimize) on the simulator."""

from __future__ import annotations

import math

import pytest

from benchmarks.drift_tune import (
    BYTESCHEDULER_SPACE,
    Knob,
    bayes_minimize,
    default_knobs,
    simulate_knobs,
    tune,
)
from pace.errors import InputError
from pace.sim import simulate
from pace.synth import random_trace


@pytest.mark.slow  # ~10 s on a loaded 2-core machine (25 GP fits)
def test_bayes_minimize_finds_the_minimum_of_a_known_function() -> None:
    space = (
        Knob(name="size", low=1.0, high=1e6, log=True),
        Knob(name="credit", low=1, high=8, integer=True),
    )
    calls: list[dict[str, float]] = []

    def f(k: dict[str, float]) -> float:
        calls.append(k)
        return (math.log10(k["size"]) - 3.0) ** 2 + 0.1 * (k["credit"] - 5) ** 2

    best, value, history = bayes_minimize(f, space, x0={"size": 10.0, "credit": 1}, n_calls=25)
    assert calls[0] == {"size": 10.0, "credit": 1.0}  # the default goes first
    assert best["credit"] == 5.0
    assert math.log10(best["size"]) == pytest.approx(3.0, abs=0.3)
    assert value == min(v for _, v in history)
    assert len(history) == len(calls) <= 25
    assert all(float(k["credit"]).is_integer() for k, _ in history)


@pytest.mark.parametrize("policy", ["bytescheduler", "horovod"])
def test_tuned_is_never_worse_than_default_and_is_reproducible(policy: str) -> None:
    trace = random_trace(seed=21, n_layers=10, alpha_us=40.0)
    res = tune(trace, policy, n_calls=10, seed=1)
    assert res.policy == policy
    assert res.iteration_us <= res.default_us
    assert res.default_knobs == default_knobs(policy)
    # The reported time is the simulator's replay of exactly those knobs.
    assert simulate_knobs(trace, policy, res.knobs) == pytest.approx(res.iteration_us)
    assert res.default_us == pytest.approx(simulate_knobs(trace, policy, res.default_knobs))
    assert tune(trace, policy, n_calls=10, seed=1).knobs == res.knobs


def test_bytescheduler_knobs_reach_the_simulator() -> None:
    trace = random_trace(seed=22, n_layers=6, alpha_us=20.0)
    knobs = {"partition_bytes": 64 * 1024.0, "credit_units": 2.0}
    res = simulate(trace, "fifo")  # sanity: the simulator itself runs on this trace
    assert res.iteration_us > 0
    from benchmarks.drift_tune import knob_policy

    pol = knob_policy("bytescheduler", knobs)
    sim = simulate(trace, pol)
    assert sim.knobs["partition_bytes"] == 64 * 1024
    assert sim.knobs["credit_units"] == 2
    assert max(u.size_bytes for u in sim.units) <= 64 * 1024


def test_tuning_beats_default_where_partitioning_matters() -> None:
    # A 40 Gbps ring where compute and communication are of similar size: the default
    # (32 MB partitions, credit 2) leaves 20% on the table (the simulator's exhaustive grid,
    # `bytescheduler-tuned`, finds 19.0 ms vs 23.7 ms); BO must find most of it in 10 calls.
    beta = 2 * 7 / 8 * 8 / 40e3
    trace = random_trace(seed=1, n_layers=12, alpha_us=10.0, beta_us_per_byte=beta)
    res = tune(trace, "bytescheduler", n_calls=10, seed=0)
    grid = simulate(trace, "bytescheduler-tuned").iteration_us
    assert grid < res.default_us * 0.85
    assert res.iteration_us <= grid * 1.02, (res.iteration_us, grid)


def test_errors() -> None:
    trace = random_trace(seed=23, n_layers=3)
    with pytest.raises(InputError, match="tunable"):
        tune(trace, "fifo")
    with pytest.raises(ValueError, match="low < high"):
        Knob(name="x", low=2.0, high=1.0)
    with pytest.raises(ValueError, match="log-scale"):
        Knob(name="x", low=0.0, high=1.0, log=True)
    with pytest.raises(ValueError, match="n_calls"):
        bayes_minimize(lambda k: 0.0, BYTESCHEDULER_SPACE, n_calls=0)
