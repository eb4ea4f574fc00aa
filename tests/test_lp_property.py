"""Property tests of pace.lp over random DNN-like DAG traces (hypothesis, >= 300 traces each)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.compiler import reference_units
from pace.ir import FusionPlan, Trace
from pace.lp import lower_bound_us, reduction, schedule, slot_instance, solve_exact, solve_lp
from pace.sim import compare, simulate
from pace.verify import verify_schedule
from tests.strategies import integer_traces, traces


def _exact(trace: Trace, plan: FusionPlan | None = None) -> float:
    red = reduction(trace, plan)
    return solve_exact(
        red.release_us,
        red.duration_us,
        red.tail_us,
        compute_makespan_us=red.compute_makespan_us,
    ).makespan_us


def _check_assignment(trace: Trace, plan: FusionPlan | None, backend: str) -> None:
    red = reduction(trace, plan)
    inst = slot_instance(red, slot_us=1.0)
    sol = solve_lp(inst, backend=backend)
    # On integer instances with 1-us slots the slotted LP and the continuous optimum agree.
    assert sol.makespan_slots == _exact(trace, plan)
    assert sol.integral
    # The assignment is a schedule: each job gets its slots inside its window, one at a time.
    got = np.zeros(red.n_jobs)
    busy: list[tuple[float, float]] = []
    for j, first, n in sol.assignment:
        assert first >= inst.release[j]
        assert first + n <= sol.makespan_slots - inst.tail[j]
        got[j] += n
        busy.append((first, first + n))
    assert got.tolist() == inst.duration.tolist()
    busy.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(busy))


@pytest.mark.slow  # ~3,000 LP solves (the search without a hint, as a user would run it)
@settings(max_examples=300)
@given(integer_traces(), st.sampled_from(["highs", "scipy"]))
def test_lp_optimum_equals_exact_optimum(trace: Trace, backend: str) -> None:
    _check_assignment(trace, None, backend)


@settings(max_examples=300)
@given(integer_traces())
def test_alpha0_compiled_replay_is_optimal_and_beats_every_baseline(trace: Trace) -> None:
    s = schedule(trace).schedule
    opt = _exact(trace)
    assert s.predicted_iteration_us == pytest.approx(opt, rel=1e-6)
    assert lower_bound_us(trace) == pytest.approx(opt, rel=1e-12)
    # predicted = the simulator's replay of exactly these units.
    assert simulate(trace, s).iteration_us == s.predicted_iteration_us
    verify_schedule(s, trace)  # every byte of every tensor covered exactly once
    for name, res in compare(trace).items():
        assert s.predicted_iteration_us <= res.iteration_us + 1e-9, name


@settings(max_examples=300)
@given(traces(max_layers=10))
def test_alpha0_float_traces_optimal_up_to_byte_rounding(trace: Trace) -> None:
    trace = replace(trace, comm=replace(trace.comm, alpha_us=0.0))
    s = schedule(trace).schedule
    opt = _exact(trace)
    # Partition boundaries are rounded up to whole bytes: each unit may end < beta late.
    slack = len(s.units) * trace.comm.beta_us_per_byte
    assert opt - 1e-9 * opt <= s.predicted_iteration_us <= opt + max(1e-6 * opt, slack)
    verify_schedule(s, trace)


ONE_AT_A_TIME = ("fifo", "tictac", "p3")
"""Baselines without fusion and with one unit in flight: a no-fusion schedule must beat them.

Fusing baselines (horovod, ddp) are matched by the fusion stage; credit > 1 (bytescheduler)
shares bandwidth, i.e. preempts without paying alpha again, which one channel cannot express
(the measured gap is in docs/scheduling.md)."""


@settings(max_examples=300)
@given(traces(max_layers=10))
def test_overhead_aware_never_worse_than_one_at_a_time_baselines(trace: Trace) -> None:
    s = schedule(trace, references=reference_units(trace)).schedule
    verify_schedule(s, trace)
    res = compare(trace, policies=ONE_AT_A_TIME)
    for name in ONE_AT_A_TIME:
        assert s.predicted_iteration_us <= res[name].iteration_us * (1 + 1e-9), name
    # Every job pays alpha at least once: largest tail first with whole-job durations bounds it.
    assert s.predicted_iteration_us >= s.meta["plan_bound_us"] * (1 - 1e-9)
    # Never worse than the plain optimal split either (overhead-aware keeps the better).
    assert s.predicted_iteration_us <= s.meta["candidates_us"]["exact"] + 1e-6


@st.composite
def fused(draw: st.DrawFn) -> tuple[Trace, FusionPlan]:
    trace = draw(integer_traces())
    names = [t.name for t in trace.tensors]
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(names) - 1)))))
    bounds = [0, *[c for c in cuts if c < len(names)], len(names)]
    groups = tuple(tuple(names[a:b]) for a, b in itertools.pairwise(bounds) if b > a)
    return trace, FusionPlan(groups=groups, method="test")


@settings(max_examples=300)
@given(fused(), st.sampled_from([1, 64]))
def test_fused_plans_lp_equals_exact_and_units_cover_bytes(
    case: tuple[Trace, FusionPlan], scale: int
) -> None:
    trace, plan = case
    # scale 64 with beta 1/64: same times, but every tensor has more bytes than any group has
    # pieces, so every unit of a group can carry a byte of the member released last.
    trace = replace(
        trace,
        tensors=tuple(replace(t, size_bytes=t.size_bytes * scale) for t in trace.tensors),
        comm=replace(trace.comm, beta_us_per_byte=1.0 / scale),
    )
    _check_assignment(trace, plan, "highs")
    s = schedule(trace, plan).schedule
    verify_schedule(s, trace)
    # The units never replay slower than their plan does at job level (members may finish
    # before their group does, which only helps)...
    assert s.predicted_iteration_us <= s.meta["candidates_us"][s.meta["chosen"]] * (1 + 1e-9)
    if scale > 1:
        # ... and with enough bytes the optimal split is kept, so the exact optimum holds.
        assert s.predicted_iteration_us <= _exact(trace, plan) * (1 + 1e-9)


@settings(max_examples=100)
@given(traces(max_layers=10), st.sampled_from([100, 1000]))
def test_lp_path_with_automatic_slots_is_near_optimal(trace: Trace, max_slots: int) -> None:
    trace = replace(trace, comm=replace(trace.comm, alpha_us=0.0))
    s = schedule(trace, solver="lp", max_slots=max_slots).schedule
    verify_schedule(s, trace)
    info = s.meta["lp"]
    assert info["integral"]
    opt = _exact(trace)
    bound = (s.meta["jobs"] + 2) * info["slot_us"]
    # The slotted optimum brackets the continuous one (docs/scheduling.md, rounding bound) ...
    assert opt * (1 - 1e-9) <= info["makespan_us"] <= opt + bound + 1e-6
    # ... and the LP's order executed in continuous time is within the same bound.
    assert opt * (1 - 1e-9) <= s.predicted_iteration_us <= opt + bound + 1e-6
