"""A schedule robust to the compute's speed (``pace.hedge.robust_to_compute``,
``compile_trace(compute_hedge=...)``, ``pace compile --hedge-compute``)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.cli import main
from pace.compiler import FRAMEWORK_MARGIN, apply_what_if, compile_trace, framework_path_us
from pace.errors import InputError
from pace.hedge import TIE, regrets, robust_to_compute
from pace.io import load_schedule, save_trace, schedule_from_dict, schedule_to_dict
from pace.ir import FrameworkPath, Schedule, Trace
from pace.lp import ROBUST_TOLERANCE
from pace.sim import schedule_policy, simulate
from pace.synth import random_trace
from tests.strategies import traces

_times = st.floats(1.0, 1e6, allow_nan=False)


@st.composite
def _candidates(draw: st.DrawFn) -> tuple[list[float], list[list[float]]]:
    n = draw(st.integers(1, 5))
    worlds = draw(st.integers(1, 3))
    nominal = [draw(_times) for _ in range(n)]
    return nominal, [[draw(_times) for _ in range(worlds)] for _ in range(n)]


@given(_candidates(), st.sampled_from([0.0, 0.005, 0.05]))
def test_the_pick_is_admissible_and_loses_least_among_the_admissible(
    cands: tuple[list[float], list[list[float]]], tolerance: float
) -> None:
    nominal, replays = cands
    pick = robust_to_compute(nominal, replays, tolerance=tolerance)
    # Never more than the tolerance slower than the pipeline's choice on the trace itself.
    assert nominal[pick] <= nominal[0] * (1.0 + tolerance)
    admissible = [i for i, us in enumerate(nominal) if us <= nominal[0] * (1.0 + tolerance)]
    worst = dict(zip(admissible, regrets([replays[i] for i in admissible]), strict=True))
    assert all(worst[pick] <= w + TIE for w in worst.values())
    # The pipeline's choice stays unless another admissible one loses less by more than a tie.
    if pick != 0:
        assert worst[pick] < worst[0] - TIE


@given(_candidates())
def test_a_candidate_slower_on_the_trace_is_never_shipped_without_tolerance(
    cands: tuple[list[float], list[list[float]]],
) -> None:
    nominal, replays = cands
    # However much faster it is at the other speeds.
    faster = [[us / 100.0 for us in replays[0]]]
    pick = robust_to_compute([*nominal, nominal[0] * 1.01], [*replays, *faster], tolerance=0.0)
    assert pick != len(nominal)


def test_candidates_and_rows_must_pair_up() -> None:
    with pytest.raises(InputError, match="one row of world replays per candidate"):
        robust_to_compute([1.0, 2.0], [[1.0]], tolerance=0.0)
    with pytest.raises(InputError, match="one row of world replays per candidate"):
        robust_to_compute([], [], tolerance=0.0)


def _in_order_us(schedule: Schedule, trace: Trace) -> float:
    return float(simulate(trace, schedule_policy(schedule, in_order=True)).iteration_us)


@settings(max_examples=12, deadline=None)
@given(traces(max_layers=6), st.sampled_from([1.25, 2.0, 4.0]))
def test_the_hedged_schedule_keeps_the_trace_and_loses_no_more_at_the_speed(
    trace: Trace, speedup: float
) -> None:
    """Against the pipeline's schedule (no hedge): on the trace at most the robust tolerance
    slower, in the runtime's issue order; at the hedged speed no slower beyond a tie."""
    plain = compile_trace(trace, baselines=False, framework=False)
    hedged = compile_trace(trace, baselines=False, framework=False, compute_hedge=[speedup])
    world = apply_what_if(trace, compute_speedup=speedup)
    nominal = _in_order_us(hedged.schedule, trace)
    assert nominal <= _in_order_us(plain.schedule, trace) * (1.0 + ROBUST_TOLERANCE) + 1e-6
    assert hedged.predicted_iteration_us == pytest.approx(nominal, rel=1e-9)
    at_speed = _in_order_us(hedged.schedule, world)
    assert at_speed <= _in_order_us(plain.schedule, world) * (1.0 + TIE) + 1e-6
    info = hedged.schedule.meta["compute_hedge"]
    assert info["speedups"] == [speedup]
    assert info["nominal_us"][0] == pytest.approx(_in_order_us(plain.schedule, trace))
    if info["chosen"] == 0:
        assert hedged.schedule.units == plain.schedule.units
    assert hedged.schedule.trace_digest == plain.schedule.trace_digest
    assert hedged.schedule.cost_model == plain.schedule.cost_model


# Found by search over seeds: a schedule compiled for compute twice as fast replays 0.1% faster
# than the pipeline's on the trace (in the runtime's order) and 0.3% faster with compute twice
# as fast. The search found such cases on 6 of 160 (seed, size, alpha) tries.
def _flip() -> Trace:
    return random_trace(seed=3, n_layers=6, alpha_us=200.0)


def test_a_schedule_as_fast_on_the_trace_and_faster_at_the_speed_ships(tmp_path: Path) -> None:
    trace = _flip()
    # The compute hedge alone: the order search (on by default) finds the hedged schedule's
    # order from the pipeline's here too (tests/test_order_search.py covers it).
    plain = compile_trace(trace, framework=False, order_search=False)
    hedged = compile_trace(trace, framework=False, compute_hedge=[2.0], order_search=False)
    info = hedged.schedule.meta["compute_hedge"]
    assert info["chosen"] == 1
    world = apply_what_if(trace, compute_speedup=2.0)
    assert _in_order_us(hedged.schedule, world) < _in_order_us(plain.schedule, world)
    assert _in_order_us(hedged.schedule, trace) <= _in_order_us(plain.schedule, trace) * 1.005
    assert hedged.schedule.units != plain.schedule.units
    # The schedule is the trace's: it validates against the trace file, not the scaled world.
    trace_path, out = tmp_path / "t.json", tmp_path / "s.json"
    save_trace(trace, trace_path)
    argv = ["compile", str(trace_path), "-o", str(out), "--hedge-compute", "2"]
    assert main([*argv, "--no-order-search"]) == 0
    assert load_schedule(out).meta["compute_hedge"]["chosen"] == 1
    assert main(["validate", str(out), "--trace", str(trace_path)]) == 0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_compute_speedups_must_be_finite_and_positive(bad: float) -> None:
    with pytest.raises(InputError, match="compute speed-ups must be finite numbers > 0"):
        compile_trace(random_trace(seed=1, n_layers=3), compute_hedge=[bad])


def test_cli_prints_the_compute_hedge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace_path, out = tmp_path / "t.json", tmp_path / "s.json"
    save_trace(_flip(), trace_path)
    argv = ["compile", str(trace_path), "-o", str(out), "--hedge-compute", "2", "--no-order-search"]
    assert main([*argv, "--hedge-compute", "1.5", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["compute_hedge"]
    assert info["speedups"] == [2.0, 1.5]
    assert info["candidates"] == ["the pipeline's", "compiled at x2", "compiled at x1.5"]
    assert len(info["replays_us"]) == 3
    assert all(len(row) == 2 for row in info["replays_us"])
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "compute hedge" in text
    assert "* compiled at x2" in text
    # With the order search each compiled schedule is also a candidate as it leaves it.
    assert main([*argv[:-1], "--json"]) == 0
    labels = json.loads(capsys.readouterr().out)["compute_hedge"]["candidates"]
    assert labels[:2] == ["the pipeline's", "compiled at x2"]
    assert set(labels[2:]) <= {"compiled at x2, order searched"}


@pytest.mark.parametrize("bad", ["nan", "0", "-2", "inf", "x"])
def test_cli_refuses_a_bad_speed_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    trace_path = tmp_path / "t.json"
    save_trace(random_trace(seed=1, n_layers=3), trace_path)
    argv = ["compile", str(trace_path), "-o", str(tmp_path / "s.json"), "--hedge-compute", bad]
    code: object
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own error: not a number at all
        code = exc.code
    assert code == 2
    assert "--hedge-compute" in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()


# --- the file's in_order: the prediction in the runtime's issue order -----------------------


def test_a_compute_hedged_schedule_says_its_prediction_is_in_the_runtimes_order() -> None:
    trace = _flip()
    hedged = compile_trace(trace, framework=False, compute_hedge=[2.0]).schedule
    plain = compile_trace(trace, framework=False, compute_hedge=[1.0], order_search=False).schedule
    # Numbered in its start order on the scaled trace, its contract replay on the trace would
    # send a ready later unit first; the file says its prediction is the runtime's order.
    assert hedged.in_order
    assert simulate(trace, schedule_policy(hedged)).iteration_us == pytest.approx(
        _in_order_us(hedged, trace)
    )
    assert simulate(trace, schedule_policy(hedged, in_order=False)).iteration_us != pytest.approx(
        _in_order_us(hedged, trace)
    )
    # The pipeline's own choice is in issue order on the trace: no flag needed.
    assert plain.meta["compute_hedge"]["chosen"] == 0
    assert not plain.in_order


def test_in_order_round_trips_and_old_files_mean_the_contract(tmp_path: Path) -> None:
    trace = _flip()
    hedged = compile_trace(trace, framework=False, compute_hedge=[2.0]).schedule
    obj = schedule_to_dict(hedged)
    assert obj["in_order"] is True
    assert schedule_from_dict(obj).in_order
    del obj["in_order"]
    assert not schedule_from_dict(obj).in_order
    assert "in_order" not in schedule_to_dict(schedule_from_dict(obj))


@pytest.mark.parametrize("bad", ["yes", 1, None, [True]])
def test_a_bad_in_order_is_refused_naming_the_field_and_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: object
) -> None:
    trace = _flip()
    obj = schedule_to_dict(compile_trace(trace, framework=False, compute_hedge=[2.0]).schedule)
    obj["in_order"] = bad
    path = tmp_path / "s.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(InputError) as err:
        schedule_from_dict(obj, where=str(path))
    assert err.value.field == "in_order"
    assert main(["validate", str(path)]) == 2
    assert "in_order" in capsys.readouterr().err


# --- the framework's own path, weighed at the hedged speeds too -----------------------------


def _with_path(trace: Trace, scale: float) -> Trace:
    path = FrameworkPath(
        backend="horovod",
        alpha_us=trace.comm.alpha_us * scale,
        beta_us_per_byte=trace.comm.beta_us_per_byte * scale,
    )
    return dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, framework=path))


def test_units_within_the_margin_ship_where_a_faster_compute_puts_them_beyond_it() -> None:
    """Found by search: the units replay 4.99% faster than the path on the trace (the margin
    is 5%: the path would train), 5.6% faster with compute 2x or 4x as fast. Found before the
    order search joined units (joined, they are beyond the margin on the trace too), so the
    case is compiled with its moves only."""
    trace = _with_path(random_trace(seed=3, n_layers=6, alpha_us=30.0, beta_us_per_byte=3e-4), 1)
    plain = compile_trace(trace, baselines=False, join_units=False)
    assert plain.schedule.framework == "horovod"
    res = compile_trace(trace, baselines=False, compute_hedge=[2.0], join_units=False)
    assert res.schedule.framework is None
    weighed = res.schedule.meta["framework_weighed"]
    world = apply_what_if(trace, compute_speedup=2.0)
    assert weighed["path_us"] == [pytest.approx(framework_path_us(world))]
    assert weighed["units_us"][0] * (1 + FRAMEWORK_MARGIN) <= weighed["path_us"][0]
    assert res.framework_us is not None
    assert res.predicted_iteration_us <= res.framework_us  # never slower on the trace


@settings(max_examples=15, deadline=None)
@given(traces(max_layers=6), st.sampled_from([0.9, 1.0, 1.1]), st.sampled_from([1.5, 4.0]))
def test_the_hedge_keeps_units_only_never_slower_than_the_path(
    trace: Trace, scale: float, speedup: float
) -> None:
    trace = _with_path(trace, scale)
    res = compile_trace(trace, baselines=False, compute_hedge=[speedup])
    weighed = res.schedule.meta.get("framework_weighed")
    if weighed is None:
        return
    assert res.schedule.framework is None
    assert res.framework_us is not None
    assert res.predicted_iteration_us <= res.framework_us
    world = apply_what_if(trace, compute_speedup=speedup)
    path_us = framework_path_us(world)
    assert path_us is not None
    units_us = _in_order_us(res.schedule, world)
    assert units_us == pytest.approx(weighed["units_us"][0])
    assert units_us * (1 + FRAMEWORK_MARGIN) <= path_us * (1 + 1e-9)
