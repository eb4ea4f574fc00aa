"""The compiled schedule's priorities are the order its replay starts the units, so the
runtime, which must issue collectives strictly in priority order (every rank the same order,
no negotiation), issues them exactly as the prediction assumed (pace.compiler.in_issue_order)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.cli import main
from pace.compiler import compile_trace, in_issue_order, issue_order_problem
from pace.digest import trace_digest
from pace.io import save_schedule, save_trace
from pace.ir import CommModel, Interference, Op, Schedule, Slice, Tensor, Trace, Unit
from pace.sim import schedule_policy, simulate
from pace.sim.core import Policy
from tests.strategies import shuffled_priorities, traces


def strictly_in_order(schedule: Schedule) -> Policy:
    """The runtime's dispatcher: units in priority order, each once it is ready."""
    return schedule_policy(schedule, name="strict", in_order=True)


def late_first() -> tuple[Trace, Schedule]:
    """w2 is produced at 10 us, w1 at 100 us; the schedule lists w1 first (it is needed first),
    so the replay sends w2 while w1 is not ready, and a strict issuer would wait for w1."""
    trace = Trace(
        model="late-first",
        ops=(
            Op(name="b2", phase="backward", duration_us=10),
            Op(name="b1", phase="backward", duration_us=90, deps=("b2",)),
            Op(name="f1", phase="forward", duration_us=5, deps=("b1",)),
            Op(name="f2", phase="forward", duration_us=5, deps=("f1",)),
        ),
        tensors=(
            Tensor(name="w1", size_bytes=10, producer="b1", consumers=("f1",)),
            Tensor(name="w2", size_bytes=80, producer="b2", consumers=("f2",)),
        ),
        comm=CommModel(workers=2, alpha_us=0.0, beta_us_per_byte=1.0),
    )
    units = (
        Unit(priority=0.0, slices=(_whole(trace, "w1"),)),
        Unit(priority=1.0, slices=(_whole(trace, "w2"),)),
    )
    sched = Schedule(
        units=units, predicted_iteration_us=0.0, trace_digest="", cost_model=trace.comm
    )
    return trace, sched


def _whole(trace: Trace, name: str) -> Slice:
    size = next(t.size_bytes for t in trace.tensors if t.name == name)
    return Slice(tensor=name, offset_bytes=0, size_bytes=size)


def test_a_late_first_unit_is_renumbered_after_the_one_sent_before_it() -> None:
    trace, sched = late_first()
    contract = simulate(trace, schedule_policy(sched)).iteration_us
    # The strict issuer waits for w1 (ready at 100) before sending w2: later than predicted.
    assert simulate(trace, strictly_in_order(sched)).iteration_us > contract
    fixed = in_issue_order(sched, trace)
    assert [u.slices[0].tensor for u in sorted(fixed.units, key=lambda u: u.priority)] == [
        "w2",
        "w1",
    ]
    assert simulate(trace, schedule_policy(fixed)).iteration_us == pytest.approx(contract)
    assert simulate(trace, strictly_in_order(fixed)).iteration_us == pytest.approx(contract)


@settings(max_examples=40, deadline=None)
@given(trace=traces(max_layers=8), interference=st.booleans())
def test_compiled_priorities_are_the_replays_order(trace: Trace, interference: bool) -> None:
    """The shipped schedule's replay is unchanged, its units start in priority order, and
    issuing them strictly in that order (the runtime) replays the same iteration."""
    if interference:
        term = Interference(us_per_byte=1e-4, us_per_call=5.0, comm_stretch=0.1)
        trace = dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, interference=term))
    res = compile_trace(trace, baselines=False)
    sched = res.schedule
    replay = simulate(res.trace, schedule_policy(sched))
    assert replay.iteration_us == pytest.approx(sched.predicted_iteration_us, rel=1e-9)
    by_priority = sorted(range(len(sched.units)), key=lambda u: sched.units[u].priority)
    starts = [replay.unit_start_us[u] for u in by_priority]
    assert starts == sorted(starts)
    strict = simulate(res.trace, strictly_in_order(sched))
    assert strict.iteration_us == pytest.approx(replay.iteration_us, rel=1e-9, abs=1e-6)


def test_issue_order_problem_names_the_late_first_unit_and_clears_once_renumbered() -> None:
    trace, sched = late_first()
    starts = simulate(trace, schedule_policy(sched)).unit_start_us
    why = issue_order_problem(sched, starts)
    assert why is not None
    assert "unit 0 (priority 0)" in why
    assert "unit 1 would wait behind it" in why
    fixed = in_issue_order(sched, trace)
    assert issue_order_problem(fixed, simulate(trace, schedule_policy(fixed)).unit_start_us) is None


@settings(max_examples=40, deadline=None)
@given(trace=traces(max_layers=8), seed=st.randoms(use_true_random=False))
def test_issue_order_problem_iff_strict_issue_is_not_the_replay(trace: Trace, seed: Any) -> None:
    """Whatever the priorities: no problem reported means the strict issuer replays the same
    iteration; renumbering always clears the report."""
    sched = compile_trace(trace, baselines=False).schedule
    shuffled = shuffled_priorities(sched, seed)
    replay = simulate(trace, schedule_policy(shuffled))
    if issue_order_problem(shuffled, replay.unit_start_us) is None:
        strict = simulate(trace, strictly_in_order(shuffled))
        assert strict.iteration_us == pytest.approx(replay.iteration_us, rel=1e-9, abs=1e-6)
    fixed = in_issue_order(shuffled, trace)
    assert issue_order_problem(fixed, simulate(trace, schedule_policy(fixed)).unit_start_us) is None


def test_validate_warns_about_a_schedule_out_of_runtime_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, sched = late_first()
    trace_path = tmp_path / "t.json"
    save_trace(trace, trace_path)
    digest = trace_digest(trace)
    for name, numbered in (("bad", sched), ("good", in_issue_order(sched, trace))):
        replayed = simulate(trace, schedule_policy(numbered)).iteration_us
        save_schedule(
            dataclasses.replace(numbered, trace_digest=digest, predicted_iteration_us=replayed),
            tmp_path / f"{name}.json",
        )
        assert (
            main(["validate", str(tmp_path / f"{name}.json"), "--trace", str(trace_path), "--json"])
            == 0
        )
        out = capsys.readouterr()
        assert json.loads(out.out)["in_runtime_order"] is (name == "good")
        assert ("strictly in priority order" in out.err) is (name == "bad")


@settings(max_examples=40, deadline=None)
@given(trace=traces(max_layers=8), seed=st.randoms(use_true_random=False))
def test_the_runtimes_replay_starts_units_in_priority_order(trace: Trace, seed: Any) -> None:
    """``schedule_policy(..., in_order=True)``: whatever the priorities, no unit starts before
    one with a smaller priority, as the runtime issues them; the contract's replay may."""
    sched = compile_trace(trace, baselines=False).schedule
    shuffled = shuffled_priorities(sched, seed)
    strict = simulate(trace, schedule_policy(shuffled, in_order=True))
    by_priority = sorted(range(len(shuffled.units)), key=lambda u: shuffled.units[u].priority)
    starts = [strict.unit_start_us[u] for u in by_priority]
    assert starts == sorted(starts)


def test_the_runtimes_replay_waits_for_a_late_first_unit() -> None:
    trace, sched = late_first()
    strict = simulate(trace, schedule_policy(sched, in_order=True))
    contract = simulate(trace, schedule_policy(sched))
    # w1 (priority 0) is ready at 100 us: the runtime sends w2 only after it; the contract
    # sends w2 at 10 us.
    assert contract.unit_start_us == pytest.approx((100.0, 10.0))
    assert strict.unit_start_us == pytest.approx((100.0, 110.0))


def test_drift_predicts_the_running_schedule_as_the_runtime_issues_it() -> None:
    """The drift loop's prediction of the running plan (``predict_schedule``, also what
    ``pace recompile --schedule`` reports) is the runtime's replay, not the contract's."""
    from pace.drift.replan import predict_schedule

    trace, sched = late_first()
    strict = simulate(trace, strictly_in_order(sched)).iteration_us
    assert predict_schedule(trace, sched) == pytest.approx(strict)
    assert strict > simulate(trace, schedule_policy(sched)).iteration_us


def test_drift_takes_observed_units_back_by_the_runtimes_replay() -> None:
    """The estimate compares what the monitor saw of the running schedule with that schedule's
    replay (``replayed_spans``): the runtime's. In the late-first case w2 goes beside ``b1`` in
    the contract's replay, but after w1, beside ``f1``, in the runtime's: the units the runtime
    ran are taken back to exactly the idle link's cost."""
    from pace.drift.estimate import replayed_spans

    trace, sched = late_first()
    term = Interference(comm_stretch=0.5)
    trace = dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, interference=term))
    strict = simulate(trace, strictly_in_order(sched))
    contract = simulate(trace, schedule_policy(sched))
    took = [f - s for s, f in zip(strict.unit_start_us, strict.unit_finish_us, strict=True)]
    other = [f - s for s, f in zip(contract.unit_start_us, contract.unit_finish_us, strict=True)]
    assert took != pytest.approx(other)  # the two replays charge the units differently
    spans = replayed_spans(trace, sched)
    for unit, us in zip(sched.units, took, strict=True):
        size = sum(s.size_bytes for s in unit.slices)
        assert spans.alone_us(size, us) == pytest.approx(trace.comm.cost_us(size))
