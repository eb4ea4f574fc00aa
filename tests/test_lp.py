"""Unit tests of pace.lp: worked examples with hand-computed numbers, brute force, solver errors."""

from __future__ import annotations

import functools
import itertools
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.compiler import reference_units
from pace.errors import InfeasibleError, InputError, SolverMissingError, SolverTimeoutError
from pace.ir import CommModel, FusionPlan, Op, Tensor, Trace
from pace.lp import (
    choose_slot_us,
    lower_bound_us,
    reduction,
    schedule,
    slot_instance,
    solve_deadline,
    solve_exact,
    solve_lp,
)
from pace.lp.model import SlotInstance
from pace.sim import simulate
from pace.verify import verify_schedule

# The worked example of docs/design.md (tests must not depend on files outside the repo).
EXAMPLES = Path(__file__).resolve().parent / "data"


def _chain_trace(
    bw_us: list[float],
    fw_us: list[float],
    sizes: list[int],
    *,
    alpha_us: float = 0.0,
) -> Trace:
    """Layers L..1 backward then 1..L forward; layer l's gradient is produced by bw.l and
    consumed by fw.l (the DAG of the paper's Fig. 2)."""
    n = len(sizes)
    ops: list[Op] = []
    prev: str | None = None
    for layer in range(n, 0, -1):
        name = f"bw.{layer}"
        ops.append(
            Op(
                name=name,
                phase="backward",
                duration_us=bw_us[n - layer],
                deps=(prev,) if prev else (),
            )
        )
        prev = name
    for layer in range(1, n + 1):
        name = f"fw.{layer}"
        ops.append(
            Op(
                name=name,
                phase="forward",
                duration_us=fw_us[layer - 1],
                deps=(prev,) if prev else (),
            )
        )
        prev = name
    tensors = tuple(
        Tensor(
            name=f"w{layer}",
            size_bytes=sizes[layer - 1],
            producer=f"bw.{layer}",
            consumers=(f"fw.{layer}",),
        )
        for layer in range(n, 0, -1)
    )
    return Trace(
        model="chain",
        ops=tuple(ops),
        tensors=tensors,
        comm=CommModel(workers=2, alpha_us=alpha_us, beta_us_per_byte=1.0),
    )


def fig2_trace(alpha_us: float = 0.0) -> Trace:
    # w3 (30 B) ready at 10, w2 (12 B) at 20, w1 (4 B) at 30; forward 5 us per layer.
    return _chain_trace([10, 10, 10], [5, 5, 5], [4, 12, 30], alpha_us=alpha_us)


def test_fig2_reduction_by_hand() -> None:
    red = reduction(fig2_trace())
    assert red.jobs == (("w3",), ("w2",), ("w1",))
    assert red.release_us.tolist() == [10.0, 20.0, 30.0]
    # tail = consumer's start to the end of the window: fw.3 = 5, fw.2..3 = 10, fw.1..3 = 15
    assert red.tail_us.tolist() == [5.0, 10.0, 15.0]
    assert red.compute_makespan_us == 45.0


def test_fig2_preemptive_schedule_by_hand() -> None:
    """The large w3 is preempted by w2, which is preempted by the more urgent w1.

    FIFO: w3 10-40, w2 40-52, w1 52-56; fw.1 56-61, fw.2 61-66, fw.3 66-71 -> 71 us.
    Optimal: w3 10-20 (10 B), w2 20-30 (10 B), w1 30-34, w2 34-36, w3 36-56;
    fw.1 34-39, fw.2 39-44, fw.3 56-61 -> 61 us (= release 10 + all 46 bytes + tail 5, so no
    schedule can do better). Non-preemptive largest tail first: 66 us.
    """
    trace = fig2_trace()
    sol = solve_exact([10, 20, 30], [30, 12, 4], [5, 10, 15], compute_makespan_us=45)
    assert sol.pieces == (
        (0, 10.0, 20.0),
        (1, 20.0, 30.0),
        (2, 30.0, 34.0),
        (1, 34.0, 36.0),
        (0, 36.0, 56.0),
    )
    assert sol.makespan_us == 61.0
    assert sol.preemptions == 2
    assert simulate(trace, "fifo").iteration_us == 71.0
    s = schedule(trace).schedule
    assert s.predicted_iteration_us == 61.0
    assert lower_bound_us(trace) == 61.0
    got = [
        (u.priority, [(x.tensor, x.offset_bytes, x.size_bytes) for x in u.slices]) for u in s.units
    ]
    assert got == [
        (10.0, [("w3", 0, 10)]),
        (20.0, [("w2", 0, 10)]),
        (30.0, [("w1", 0, 4)]),
        (34.0, [("w2", 10, 2)]),
        (36.0, [("w3", 10, 20)]),
    ]
    assert s.meta["candidates_us"]["tail-order"] == 66.0
    verify_schedule(s, trace)


def test_fig2_overhead_aware_drops_preemptions_that_do_not_pay() -> None:
    """With 20 us per call (w3 50 us, w2 32 us, w1 24 us) splitting does not pay.

    Tail order: w3 10-60, w1 60-84, w2 84-116; fw.1 84-89, fw.2 116-121, fw.3 121-126 -> 126.
    FIFO: w3 10-60, w2 60-92, w1 92-116; forward 116-131 -> 131.
    """
    trace = fig2_trace(alpha_us=20.0)
    # The compiler hands P3's units in: the schedule is never worse than they are.
    s = schedule(trace, references=reference_units(trace)).schedule
    verify_schedule(s, trace)
    assert s.predicted_iteration_us == 126.0
    assert s.meta["preempted_jobs"] == 0
    assert simulate(trace, "fifo").iteration_us == 131.0
    # Baselines that issue one tensor-unit at a time (fusing ones are the fusion stage's match).
    for name in ("fifo", "tictac", "p3"):
        assert s.predicted_iteration_us <= simulate(trace, name).iteration_us, name
    assert s.predicted_iteration_us == simulate(trace, s).iteration_us


def test_shared_example_tiny_trace() -> None:
    from pace.io import load_trace

    trace = load_trace(EXAMPLES / "tiny.trace.json")
    for solver in ("exact", "lp"):
        s = schedule(trace, solver=solver, slot_us=1.0).schedule
        assert s.predicted_iteration_us == 39.0
        assert [(u.priority, u.slices[0].tensor, u.slices[0].size_bytes) for u in s.units] == [
            (10.0, "layer2.weight", 10),
            (20.0, "layer1.weight", 4),
            (24.0, "layer2.weight", 10),
        ]
    assert lower_bound_us(trace) == 39.0


def test_fused_group_units_span_concatenated_bytes() -> None:
    trace = fig2_trace()
    plan = FusionPlan(groups=(("w3",), ("w2", "w1")), method="test")
    red = reduction(trace, plan)
    assert red.release_us.tolist() == [10.0, 30.0]
    assert red.tail_us.tolist() == [5.0, 15.0]
    assert red.size_bytes.tolist() == [30, 16]
    s = schedule(trace, plan).schedule
    verify_schedule(s, trace)
    # w3 10-30 (20 B), group 30-46 preempts it, w3 46-56 -> fw.3 ends at 61; fw.1 at 51.
    assert s.predicted_iteration_us == 61.0
    group_units = [u for u in s.units if "w1" in u.tensors]
    assert len(group_units) == 1
    assert set(group_units[0].tensors) == {"w1", "w2"}


def test_reduction_rejects_lemma1_violation() -> None:
    ops = (
        Op(name="a", phase="backward", duration_us=1),
        Op(name="b", phase="backward", duration_us=1, deps=("a",)),
    )
    tensors = (
        Tensor(name="x", size_bytes=4, producer="a", consumers=("a",)),
        Tensor(name="y", size_bytes=4, producer="b", consumers=()),
    )
    trace = Trace(
        model="bad",
        ops=ops,
        tensors=tensors,
        comm=CommModel(workers=2, alpha_us=0, beta_us_per_byte=1),
    )
    with pytest.raises(InputError, match="Lemma 1") as info:
        reduction(trace)
    assert info.value.field == "tensors[0].consumers"


def test_reduction_rejects_cycle_and_bad_plan() -> None:
    ops = (
        Op(name="a", phase="backward", duration_us=1, deps=("b",)),
        Op(name="b", phase="backward", duration_us=1, deps=("a",)),
    )
    trace = Trace(
        model="cyc",
        ops=ops,
        tensors=(Tensor(name="x", size_bytes=4, producer="a"),),
        comm=CommModel(workers=2, alpha_us=0, beta_us_per_byte=1),
    )
    with pytest.raises(InputError, match="cycle"):
        reduction(trace)
    good = fig2_trace()
    with pytest.raises(InputError, match="no group"):
        reduction(good, FusionPlan(groups=(("w3",), ("w2",))))
    with pytest.raises(InputError, match="two groups"):
        reduction(good, FusionPlan(groups=(("w3", "w2"), ("w2", "w1"))))


# --- exact solver vs brute force ----------------------------------------------------------


def brute_force_slots(r: list[int], p: list[int], q: list[int], compute: int) -> int:
    """Best max(C_j + q_j) over EVERY integer slot schedule (idling allowed), by memoised search."""
    n = len(r)
    horizon = max(r) + sum(p) + 1

    @functools.cache
    def best(t: int, rem: tuple[int, ...]) -> float:
        if not any(rem):
            return 0.0
        if t > horizon:
            return float("inf")
        out = best(t + 1, rem)  # idle this slot
        for j in range(n):
            if rem[j] and r[j] <= t:
                nxt = list(rem)
                nxt[j] -= 1
                val = best(t + 1, tuple(nxt))
                if nxt[j] == 0:
                    val = max(val, t + 1 + q[j])
                out = min(out, val)
        return out

    return int(max(best(0, tuple(p)), compute))


@settings(max_examples=150)
@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.integers(1, 3), st.integers(0, 6)), min_size=1, max_size=4
    ),
    st.integers(0, 10),
)
def test_exact_matches_brute_force(jobs: list[tuple[int, int, int]], compute: int) -> None:
    r, p, q = (list(x) for x in zip(*jobs, strict=True))
    sol = solve_exact(r, p, q, compute_makespan_us=compute)
    assert sol.makespan_us == brute_force_slots(r, p, q, compute)
    # The pieces form a valid schedule: one job at a time, after release, exact durations.
    done = [0.0] * len(r)
    last_end = 0.0
    for j, s, e in sol.pieces:
        assert s >= r[j]
        assert e > s - 1e-12
        assert s >= last_end - 1e-12
        last_end = e
        done[j] += e - s
    assert done == pytest.approx(p)


@settings(max_examples=100)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 100, allow_nan=False),
            st.floats(0.1, 50, allow_nan=False),
            st.floats(0, 100, allow_nan=False),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_exact_equals_carlier_bound(jobs: list[tuple[float, float, float]]) -> None:
    """Preemptive optimum = max over job sets J of (min r + sum p + min q) (Carlier)."""
    r, p, q = (list(x) for x in zip(*jobs, strict=True))
    n = len(r)
    bound = max(
        min(r[j] for j in sub) + sum(p[j] for j in sub) + min(q[j] for j in sub)
        for k in range(1, n + 1)
        for sub in itertools.combinations(range(n), k)
    )
    assert solve_exact(r, p, q).makespan_us == pytest.approx(bound, rel=1e-9)


# --- LP backends and errors ---------------------------------------------------------------


def _inst(r: list[int], p: list[int], q: list[int], compute: int = 0) -> SlotInstance:
    a = functools.partial(np.asarray, dtype=np.int64)
    return SlotInstance(slot_us=1.0, release=a(r), duration=a(p), tail=a(q), compute=compute)


@pytest.mark.parametrize("backend", ["highs", "cbc", "scipy"])
def test_lp_backends_agree_on_fig2(backend: str) -> None:
    red = reduction(fig2_trace())
    inst = slot_instance(red, slot_us=1.0)
    sol = solve_lp(inst, backend=backend)
    assert sol.makespan_slots == 61
    assert sol.integral
    assert sol.max_fractionality == 0.0
    # Certified: 60 slots was tried (or is below the bound) and found infeasible.
    assert (60, False) in sol.history or inst.lower_bound == 61
    hinted = solve_lp(inst, backend=backend, hint_slots=61)
    assert hinted.makespan_slots == 61
    assert hinted.solves <= 2
    # The expansion is the slotted largest-tail-first schedule.
    assert sorted(sol.assignment, key=lambda a: a[1]) == [
        (0, 10.0, 10.0),
        (1, 20.0, 10.0),
        (2, 30.0, 4.0),
        (1, 34.0, 2.0),
        (0, 36.0, 20.0),
    ]


@pytest.mark.parametrize("backend", ["highs", "cbc", "scipy"])
def test_infeasible_horizon_raises(backend: str) -> None:
    # Each window alone is long enough (3 >= 2); together they need 4 slots in 3: only the
    # solver can tell.
    inst = _inst([0, 0], [2, 2], [0, 0])
    with pytest.raises(InfeasibleError):
        solve_deadline(inst, 3, backend=backend)
    assert len(solve_deadline(inst, 4, backend=backend)) == 2
    with pytest.raises(InfeasibleError):
        solve_deadline(inst, 1, backend=backend)  # a window shorter than its job


def test_missing_solvers_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    import pulp

    inst = _inst([0], [1], [0])
    monkeypatch.setattr(pulp.HiGHS, "available", lambda self: False)
    with pytest.raises(SolverMissingError, match="highspy"):
        solve_lp(inst, backend="highs")
    monkeypatch.setattr(pulp.PULP_CBC_CMD, "available", lambda self: False)
    with pytest.raises(SolverMissingError, match="CBC"):
        solve_lp(inst, backend="cbc")
    monkeypatch.setitem(sys.modules, "scipy.optimize", None)
    with pytest.raises(SolverMissingError, match="scipy"):
        solve_lp(inst, backend="scipy")
    monkeypatch.undo()
    monkeypatch.setattr(pulp.HiGHS, "available", lambda self: False)
    with pytest.raises(SolverMissingError):
        schedule(fig2_trace(), solver="lp")


def test_time_limit_raises() -> None:
    trace = fig2_trace()
    with pytest.raises(SolverTimeoutError):
        schedule(trace, solver="lp", time_limit_s=1e-9)
    with pytest.raises(SolverTimeoutError):
        solve_lp(slot_instance(reduction(trace), slot_us=1.0), backend="scipy", time_limit_s=1e-9)


def test_solver_status_time_limit_maps_to_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    import scipy.optimize

    def fake_linprog(*args: Any, **kwargs: Any) -> SimpleNamespace:
        return SimpleNamespace(status=1, message="Time limit reached", x=None)

    monkeypatch.setattr(scipy.optimize, "linprog", fake_linprog)
    with pytest.raises(SolverTimeoutError, match="limit"):
        solve_deadline(_inst([0], [1], [0]), 5, backend="scipy")


def test_bad_options() -> None:
    with pytest.raises(InputError, match="solver"):
        schedule(fig2_trace(), solver="magic")
    with pytest.raises(ValueError, match="backend"):
        solve_lp(_inst([0], [1], [0]), backend="glpk")
    with pytest.raises(InputError, match="time_limit_s"):
        schedule(fig2_trace(), time_limit_s=0)


def test_lp_automatic_slot_on_float_trace() -> None:
    from pace.synth import random_trace

    trace = random_trace(seed=5, n_layers=10, alpha_us=0.0)
    s = schedule(trace, solver="lp", max_slots=300).schedule
    verify_schedule(s, trace)
    info = s.meta["lp"]
    assert info["integral"]
    # The rounded optimum is an upper bound of the continuous one, within (N + 3) slots.
    opt = lower_bound_us(trace)
    assert opt - 1e-6 <= info["makespan_us"] <= opt + (s.meta["jobs"] + 3) * info["slot_us"]
    # The compiled schedule replays no worse than the LP's own slotted makespan.
    assert s.predicted_iteration_us <= info["makespan_us"] + 1e-6


def test_exact_preempts_once_the_piece_is_long_enough_despite_rounding() -> None:
    """An urgent job released while the running piece is shorter than ``min_piece_us`` preempts
    at ``start + min_piece_us``. With these values (from a failing compile of a random trace)
    ``(start + m) - start`` rounds below ``m``; the solver compared that difference, never
    preempted, and the compiled schedule sent the 19 MB gradient first (6.7% slower)."""
    start_us, alpha_us, beta_us = 600.2426023292769, 22.290056949711857, 0.0014
    min_piece_us = alpha_us + beta_us
    assert (start_us + min_piece_us) - start_us < min_piece_us  # the rounding this guards
    sol = solve_exact(
        [start_us, 606.45633214],
        [27053.0, 3565.6],
        [8.1, 2120.5],
        preempt_cost_us=alpha_us,
        min_piece_us=min_piece_us,
    )
    assert sol.preemptions == 1
    assert [j for j, _, _ in sol.pieces] == [0, 1, 0]
    assert sol.pieces[0][2] == start_us + min_piece_us


@pytest.mark.parametrize("backend", ["highs", "scipy"])
def test_real_solver_time_limit_raises(backend: str) -> None:
    """The solver itself stops at its limit (an 18,000-column LP cannot finish in 1 ms)."""
    from pace.synth import random_trace

    trace = random_trace(seed=500, n_layers=250, tensors_per_layer=(2, 2), ops_per_layer=4)
    red = reduction(trace)
    inst = slot_instance(red, slot_us=choose_slot_us(red, max_slots=1000))
    horizon = round(
        solve_exact(
            inst.release, inst.duration, inst.tail, compute_makespan_us=inst.compute
        ).makespan_us
    )
    with pytest.raises(SolverTimeoutError, match="limit"):
        solve_deadline(inst, horizon, backend=backend, time_limit_s=1e-3)
