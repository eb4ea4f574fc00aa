"""The whole drift loop against the simulator: trigger -> estimate -> recompile -> switch."""

from __future__ import annotations

import pytest

from benchmarks.drift_scenario import ScenarioOptions, balance_compute, run_scenario
from pace.ir import Trace
from pace.synth import random_trace


def _trace() -> Trace:
    # Chosen so that the link's speed changes the optimal schedule: at half bandwidth the
    # schedule compiled for full bandwidth is 12.6% slower than one compiled for half.
    trace, _ = balance_compute(
        random_trace(seed=4, n_layers=20, tensors_per_layer=(1, 3), alpha_us=30.0), 1.5
    )
    return trace


def test_replanning_fires_once_per_step_and_beats_static() -> None:
    # No jitter: the simulator is the world, so every prediction is exact.
    opts = ScenarioOptions(
        iterations=120,
        bandwidth_steps=((0, 1.0), (40, 0.5), (80, 1.0)),
        compute_jitter=0.0,
        comm_jitter=0.0,
        slow_step_prob=0.0,
        robust_samples=1,
    )
    res = run_scenario(_trace(), opts, systems=("pace-replanned", "pace-static"))
    rep, static = res.runs["pace-replanned"], res.runs["pace-static"]
    assert len(rep.iteration_us) == len(static.iteration_us) == 120
    # Once per step, after exactly K (=5) out-of-band iterations.
    assert rep.fired == (44, 84)
    # Switches happen at the protocol's sync points (every 5, lag 1) after fire + delay.
    assert rep.switches == (51, 91)
    # Steady state of the slow phase: replanned clearly better than static; back to the
    # original time once the link recovers and the plan is switched back.
    assert rep.mean_us(60, 80) < 0.95 * static.mean_us(60, 80)
    assert rep.iteration_us[100:] == pytest.approx(static.iteration_us[100:], rel=1e-9)
    assert rep.iteration_us[:44] == static.iteration_us[:44]
    assert static.fired == static.switches == ()


def test_with_jitter_replanning_does_no_harm_on_a_fragile_trace() -> None:
    # This trace's compiled schedule is timed to the microsecond: with jitter it flips between
    # two operating points ~11% apart. The switch decision averages over jittered worlds, so a
    # candidate that only wins in the noise-free replay is not adopted.
    opts = ScenarioOptions(iterations=120, bandwidth_steps=((0, 1.0), (40, 0.5), (80, 1.0)), seed=3)
    res = run_scenario(_trace(), opts, systems=("pace-replanned", "pace-static"))
    rep, static = res.runs["pace-replanned"], res.runs["pace-static"]
    assert len(rep.fired) <= 3  # one per step, plus at most one calibration of a biased model
    assert rep.mean_us(0, 120) <= 1.01 * static.mean_us(0, 120)


def test_stationary_world_with_jitter_fires_at_most_once() -> None:
    # At most one fire: the model's bias is calibrated away by the first re-estimation.
    opts = ScenarioOptions(iterations=150, bandwidth_steps=((0, 1.0),), seed=5)
    res = run_scenario(_trace(), opts, systems=("pace-replanned",))
    assert len(res.runs["pace-replanned"].fired) <= 1


def test_autobyte_retunes_on_the_same_trigger() -> None:
    opts = ScenarioOptions(
        iterations=60, bandwidth_steps=((0, 1.0), (30, 0.5)), seed=1, tune_calls=8
    )
    res = run_scenario(_trace(), opts, systems=("bytescheduler-autobyte", "bytescheduler-bo"))
    auto, bo = res.runs["bytescheduler-autobyte"], res.runs["bytescheduler-bo"]
    assert len(auto.fired) == 1
    assert len(auto.plan_seconds) == 1  # one BO re-tune
    assert auto.iteration_us[:30] == bo.iteration_us[:30]


def test_options_validate() -> None:
    with pytest.raises(ValueError, match="start at iteration 0"):
        ScenarioOptions(bandwidth_steps=((5, 1.0),))
    with pytest.raises(ValueError, match="unknown systems"):
        run_scenario(_trace(), ScenarioOptions(iterations=1), systems=("nope",))
    with pytest.raises(ValueError, match="ratio"):
        balance_compute(_trace(), 0.0)
