"""The fast paths of the baselines decide exactly what the straightforward replays decide.

``bytescheduler-tuned`` (``pace.sim.tuning``) replays its grid per tensor instead of per unit and
skips partitions by a lower bound; ``partition_units`` builds its units without the dataclass
constructors. Each is checked here against a plain reference: every grid point replayed with
``simulate`` on unit objects, the minimum taken with the same tie rule. Timings live in
``benchmarks/bench_compile.py``, not here.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from pace.analysis import analyze
from pace.ir import Slice, Trace, Unit
from pace.sim import SimOptions, simulate, tuning, units_policy
from pace.sim.policies import (
    TUNE_CREDITS,
    bytescheduler_tuned,
    layer_order,
    partition_units,
)
from tests.strategies import traces


def reference_partition_units(trace: Trace, order: tuple[int, ...], part: int) -> tuple[Unit, ...]:
    prep = analyze(trace)
    units = []
    for rank, k in enumerate(order):
        size = prep.size_bytes[k]
        for off in range(0, size, part):
            units.append(
                Unit(
                    priority=float(rank),
                    slices=(
                        Slice(
                            tensor=prep.tensor_names[k],
                            offset_bytes=off,
                            size_bytes=min(part, size - off),
                        ),
                    ),
                )
            )
    return tuple(units)


def reference_tuned(
    trace: Trace, parts: tuple[int, ...], credits: tuple[int, ...], options: SimOptions
) -> tuple[float, float, int, int]:
    """The grid as first written: every point replayed, the smallest
    (iteration, channel busy, credit, -partition)."""
    order = layer_order(analyze(trace))
    grid_credits = (options.credit,) if options.credit is not None else credits
    best: tuple[float, float, int, int] | None = None
    for part in parts:
        pol = units_policy(reference_partition_units(trace, order, part))
        for credit in grid_credits:
            res = simulate(trace, pol, options=options.over(SimOptions(credit=credit)))
            key = (res.iteration_us, res.comm_busy_us, credit, -part)
            if best is None or key < best:
                best = key
    assert best is not None
    return best


def partitions(trace: Trace) -> st.SearchStrategy[int]:
    """A partition that cuts the largest tensor into 1..24 slices (a few bytes more or less)."""
    biggest = max(t.size_bytes for t in trace.tensors)
    return st.builds(
        lambda pieces, jitter: max(1, -(-biggest // pieces) + jitter),
        st.integers(1, 24),
        st.integers(-2, 2),
    )


@st.composite
def grids(draw: st.DrawFn, trace: Trace) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Partitions around the trace's tensor sizes (so tensors are cut into 1..many slices) and
    a few credits."""
    parts = draw(st.lists(partitions(trace), min_size=1, max_size=5, unique=True).map(tuple))
    credits = draw(
        st.lists(st.integers(1, 8), min_size=1, max_size=4, unique=True).map(tuple)
        | st.just(TUNE_CREDITS)
    )
    return parts, credits


options_st = st.builds(
    SimOptions,
    credit=st.none() | st.integers(1, 5),
    barrier=st.none() | st.booleans(),
    credit_bytes=st.none() | st.integers(1, 4000),
    # One compute stream takes the replay-every-point path: the same answer by construction.
    one_compute_stream=st.none() | st.just(False),
)


@settings(max_examples=60, deadline=None)
@given(traces(max_layers=8) | traces(max_layers=8, integer=True), st.data(), options_st)
def test_tuned_grid_chooses_what_replaying_every_point_chooses(
    trace: Trace, data: st.DataObject, options: SimOptions
) -> None:
    parts, credits = data.draw(grids(trace))
    want = reference_tuned(trace, parts, credits, options)
    tuned = bytescheduler_tuned(partitions_bytes=parts, credits=credits)
    res = simulate(trace, tuned, options=options)
    assert res.knobs["partition_bytes"] == -want[3]
    assert res.knobs["credit_units"] == want[2]
    assert res.iteration_us == want[0]
    assert res.comm_busy_us == want[1]
    order = layer_order(analyze(trace))
    assert res.units == reference_partition_units(trace, order, -want[3])


@settings(max_examples=80, deadline=None)
@given(
    traces(max_layers=8) | traces(max_layers=8, integer=True),
    st.data(),
    st.integers(1, 6),
    st.booleans(),
    st.none() | st.integers(1, 4000),
)
def test_tensor_level_replay_equals_the_unit_replay_bit_for_bit(
    trace: Trace, data: st.DataObject, credit: int, barrier: bool, credit_bytes: int | None
) -> None:
    prep = analyze(trace)
    part = data.draw(partitions(trace))
    order = layer_order(prep)
    p = tuning.make_partition(prep, order, part)
    if credit == 1:
        times = tuning.serial_partition_replay(p)
    else:
        times = tuning.shared_partition_replay(p, credit, credit_bytes)
    opts = SimOptions(credit=credit, barrier=barrier, credit_bytes=credit_bytes)
    res = simulate(trace, units_policy(reference_partition_units(trace, order, part)), options=opts)
    assert tuning.iteration_of(prep, p, times, barrier) == res.iteration_us
    assert times.busy_us == res.comm_busy_us
    assert times.comm_end_us == res.comm_end_us
    assert times.done_us == [res.tensor_done_us[k] for k in order]
    # The pruning bound holds for this point.
    (bound,) = tuning.partition_lower_bounds(prep, [part], barrier)
    assert bound <= res.iteration_us * (1 + tuning.PRUNE_REL_MARGIN)


@settings(max_examples=40, deadline=None)
@given(traces(), st.data())
def test_partition_units_equal_dataclass_construction(trace: Trace, data: st.DataObject) -> None:
    prep = analyze(trace)
    part = data.draw(partitions(trace))
    order = layer_order(prep)
    got = partition_units(prep, order, part)
    want = reference_partition_units(trace, order, part)
    assert got == want
    assert [hash(u) for u in got] == [hash(u) for u in want]
    for a, b in zip(got, want, strict=True):
        assert dataclasses.astuple(a) == dataclasses.astuple(b)
