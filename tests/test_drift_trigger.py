"""The hysteresis trigger: never fires on in-band noise, fires once per step change."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.drift.trigger import DriftTrigger, TriggerOptions, TriggerState


def options_st() -> st.SearchStrategy[TriggerOptions]:
    return st.builds(
        TriggerOptions,
        deviation_threshold=st.sampled_from([0.05, 0.10, 0.2]),
        consecutive=st.integers(1, 8),
        gain_threshold=st.sampled_from([0.0, 0.05]),
        cooldown_iterations=st.integers(0, 15),
    )


@settings(max_examples=200)
@given(
    opts=options_st(),
    base_us=st.floats(10.0, 1e6),
    data=st.data(),
)
def test_stationary_noise_within_band_never_fires(
    opts: TriggerOptions, base_us: float, data: st.DataObject
) -> None:
    trig = DriftTrigger(predicted_iteration_us=base_us, options=opts)
    # Noise strictly inside the band, plus bursts of out-of-band outliers shorter than K.
    band = opts.deviation_threshold * 0.999
    n = data.draw(st.integers(50, 400))
    noise = data.draw(st.lists(st.floats(-band, band), min_size=n, max_size=n))
    burst_every = data.draw(st.integers(opts.consecutive + 1, 50))
    burst_len = opts.consecutive - 1
    for i, e in enumerate(noise):
        t = base_us * (1 + e)
        if burst_len and i % burst_every < burst_len:
            t = base_us * (1 + 3 * opts.deviation_threshold)
        assert not trig.observe(t), f"fired at {i}"
    assert trig.fired == 0
    assert trig.state is TriggerState.WATCHING


@settings(max_examples=200)
@given(opts=options_st(), data=st.data())
def test_fires_exactly_once_per_step_change(opts: TriggerOptions, data: st.DataObject) -> None:
    thr = opts.deviation_threshold
    noise = data.draw(st.floats(0.0, thr / 4))
    n_steps = data.draw(st.integers(1, 5))
    # How many iterations the re-estimation (estimate + compile) takes before it resolves.
    resolve_delay = data.draw(st.integers(0, 6))
    seg_min = opts.consecutive + resolve_delay + opts.cooldown_iterations + 2
    levels = [data.draw(st.floats(100.0, 1e5))]
    for _ in range(n_steps):
        # Far enough that even with noise every sample is outside the old band.
        up = data.draw(st.booleans())
        factor = (
            data.draw(st.floats((1 + thr) / (1 - noise) * 1.01, 3.0))
            if up
            else data.draw(st.floats(0.2, (1 - thr) / (1 + noise) * 0.99))
        )
        levels.append(levels[-1] * factor)
    seg_lens = [data.draw(st.integers(seg_min, seg_min + 40)) for _ in levels]
    trig = DriftTrigger(predicted_iteration_us=levels[0], options=opts)
    fires_per_level = [0] * len(levels)
    pending_since: int | None = None
    it = 0
    for j, (level, length) in enumerate(zip(levels, seg_lens, strict=True)):
        for _ in range(length):
            e = data.draw(st.floats(-noise, noise)) if noise > 0 else 0.0
            if trig.observe(level * (1 + e)):
                fires_per_level[j] += 1
                pending_since = it
            if pending_since is not None and it - pending_since >= resolve_delay:
                # The re-estimate finds the true new operating point.
                trig.resolve(reference_us=level)
                pending_since = None
            it += 1
    assert fires_per_level == [0] + [1] * n_steps


def test_doc_example_and_gain_threshold() -> None:
    trig = DriftTrigger(predicted_iteration_us=100.0, options=TriggerOptions(consecutive=2))
    assert [trig.observe(t) for t in (104.0, 130.0, 95.0, 130.0, 131.0)] == [
        False,
        False,
        False,
        False,
        True,
    ]
    assert trig.state is TriggerState.PENDING
    # While pending, nothing fires however far off.
    assert not any(trig.observe(500.0) for _ in range(20))
    # Gain threshold 5%: 4% is not enough, 6% is.
    assert not trig.should_switch(current_us=100.0, candidate_us=96.0)
    assert trig.should_switch(current_us=100.0, candidate_us=94.0)
    assert not trig.should_switch(current_us=100.0, candidate_us=math.nan)
    trig.resolve(reference_us=130.0)
    assert trig.state.name == "COOLDOWN"  # (not `is`: mypy keeps the PENDING narrowing)
    assert trig.reference_us == 130.0


def test_cooldown_ignores_deviation_then_rearms() -> None:
    opts = TriggerOptions(consecutive=1, cooldown_iterations=3)
    trig = DriftTrigger(predicted_iteration_us=100.0, options=opts)
    assert trig.observe(200.0)
    trig.abandon()  # failed compile: reference unchanged, but cool down
    assert trig.reference_us == 100.0
    assert [trig.observe(200.0) for _ in range(4)] == [False, False, False, True]
    assert trig.fired == 2


def test_bad_reading_breaks_streak() -> None:
    trig = DriftTrigger(predicted_iteration_us=100.0, options=TriggerOptions(consecutive=3))
    assert not trig.observe(200.0)
    assert not trig.observe(200.0)
    assert not trig.observe(math.nan)
    assert not trig.observe(200.0)
    assert not trig.observe(200.0)
    assert trig.observe(200.0)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"deviation_threshold": 0.0}, "deviation_threshold"),
        ({"deviation_threshold": math.inf}, "deviation_threshold"),
        ({"gain_threshold": -0.1}, "gain_threshold"),
        ({"consecutive": 0}, "consecutive"),
        ({"cooldown_iterations": -1}, "cooldown_iterations"),
    ],
)
def test_options_validate(kwargs: dict[str, float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        TriggerOptions(**kwargs)  # type: ignore[arg-type]


def test_prediction_must_be_positive() -> None:
    with pytest.raises(ValueError, match="predicted_iteration_us"):
        DriftTrigger(predicted_iteration_us=0.0)
