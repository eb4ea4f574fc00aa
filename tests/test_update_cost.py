"""The update between a reduction and the forward (``comm.update_us_per_byte``, issue 15).

pace's overlapped runtime steps the optimizer on a parameter once its reduction completes, on one
background thread; the next forward waits for that update. The replay charges it per byte.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.analysis import analyze
from pace.compiler import apply_what_if, compile_trace, sync_trace
from pace.errors import InputError
from pace.io import load_trace, save_trace
from pace.ir import Interference, Trace
from pace.replay import iteration_us, updated_us
from pace.sim import schedule_policy, simulate
from pace.sim.policies import fifo
from tests.strategies import traces

DATA = Path(__file__).parent / "data"
POLICIES = ("fifo", "tictac", "p3", "ddp", "bytescheduler", "horovod")
# A random trace, an update cost and a policy (the property tests below).
UPDATE_CASES = {
    "trace": traces(max_layers=8),
    "per_byte": st.floats(1e-4, 2.0),
    "policy": st.sampled_from(POLICIES),
}


def with_update(trace: Trace, per_byte: float) -> Trace:
    return dataclasses.replace(
        trace, comm=dataclasses.replace(trace.comm, update_us_per_byte=per_byte)
    )


def tiny() -> Trace:
    """docs/design.md's worked example: FIFO finishes at 44 us without updates."""
    return load_trace(DATA / "tiny.trace.json")


def test_the_forward_waits_for_the_update_which_runs_one_unit_after_the_other() -> None:
    assert simulate(tiny(), fifo()).iteration_us == 44.0
    res = simulate(with_update(tiny(), 0.5), fifo())
    # w2 is reduced at 30 and updated until 40; w1 is reduced at 34 but its update waits for
    # w2's: 40..42. fw1 runs 42..47, fw2 (w2 updated at 40) 47..52.
    assert res.tensor_done_us == (30.0, 34.0)  # the reductions' ends, as without updates
    assert res.op_start_us[2] == 42.0
    assert res.iteration_us == 52.0
    # The event loop, and the one kernel the scheduler scores with, agree.
    assert simulate(forced_event_loop(with_update(tiny(), 0.5)), fifo()).iteration_us == 52.0
    assert iteration_us(analyze(with_update(tiny(), 0.5)), res.units) == 52.0


def test_tensors_reduced_at_one_instant_are_one_update() -> None:
    # Two tensors done at 10 (one fused unit) are updated together, 10 us for their 10 bytes;
    # the one done at 12 waits for that update, then takes its own 2 us.
    assert updated_us([10.0, 10.0, 12.0], [4, 6, 2], 1.0) == [20.0, 20.0, 22.0]
    assert updated_us([12.0, 10.0, 10.0], [2, 4, 6], 1.0) == [22.0, 20.0, 20.0]
    assert updated_us([12.0, 10.0], [2, 4], 0.0) == [12.0, 10.0]


@settings(max_examples=60, deadline=None)
@given(**UPDATE_CASES)
def test_updates_delay_the_window_by_at_most_their_total(
    trace: Trace, per_byte: float, policy: str
) -> None:
    """Without interference the channel does not depend on compute (Lemma 1), so the updates
    can only delay consumers, each by no more than all updates together."""
    base = simulate(trace, policy).iteration_us
    slow = simulate(with_update(trace, per_byte), policy)
    assert slow.iteration_us >= base - 1e-6 * max(1.0, base)
    assert slow.iteration_us <= base + per_byte * trace.total_bytes + 1e-6 * max(1.0, base)
    more = simulate(with_update(trace, 2 * per_byte), policy).iteration_us
    assert more >= slow.iteration_us - 1e-6 * max(1.0, base)


def forced_event_loop(trace: Trace) -> Trace:
    """``trace`` replayed by the simulator's event loop: a vanishing interference term."""
    return dataclasses.replace(
        trace, comm=dataclasses.replace(trace.comm, interference=Interference(idle_loss=1e-300))
    )


@settings(max_examples=60, deadline=None)
@given(**UPDATE_CASES)
def test_the_fast_path_and_the_event_loop_agree_on_the_update(
    trace: Trace, per_byte: float, policy: str
) -> None:
    """The update is a pass over the reductions' ends (``pace.replay.updated_us``) on the fast
    path, and an update thread in the event loop (``drive_joint``): the same model twice."""
    slow = with_update(trace, per_byte)
    fast = simulate(slow, policy)
    loop = simulate(forced_event_loop(slow), policy)
    assert fast.iteration_us == pytest.approx(loop.iteration_us, rel=1e-9, abs=1e-6)
    assert fast.op_start_us == pytest.approx(loop.op_start_us, rel=1e-9, abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(trace=traces(max_layers=6), policy=st.sampled_from(POLICIES))
def test_no_update_cost_is_the_model_without_it(trace: Trace, policy: str) -> None:
    # The event loop with no update cost gives the fast path's answer.
    fast = simulate(trace, policy).iteration_us
    loop = simulate(forced_event_loop(trace), policy).iteration_us
    assert loop == pytest.approx(fast, rel=1e-9, abs=1e-6)


@pytest.mark.parametrize("field", ["update_us_per_byte", "copy_us_per_byte"])
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), per_byte=st.floats(1e-3, 1.0))
def test_the_compiler_optimises_with_the_cost_and_predicts_its_replay(
    field: str, seed: int, per_byte: float
) -> None:
    """With the update (or the copy-back of fused units, tests/test_copy_back.py) charged, the
    compiled schedule's prediction is its replay and beats the schedule compiled blind to it."""
    from pace.synth import random_trace

    def costing(t: Trace, value: float) -> Trace:
        return dataclasses.replace(t, comm=dataclasses.replace(t.comm, **{field: value}))

    trace = costing(random_trace(seed=seed, n_layers=6), per_byte)
    sched = compile_trace(trace).schedule
    assert getattr(sched.cost_model, field) == per_byte
    assert sched.predicted_iteration_us == pytest.approx(
        simulate(trace, schedule_policy(sched)).iteration_us, rel=1e-9
    )
    # What the compiler ships is at least as good, under the cost, as its own schedule for the
    # same job without it.
    blind = compile_trace(costing(trace, 0.0)).schedule
    assert sched.predicted_iteration_us <= simulate(trace, schedule_policy(blind)).iteration_us * (
        1 + 1e-3
    )


def test_the_sync_loop_has_no_update_in_its_window_and_a_speedup_scales_it() -> None:
    trace = with_update(tiny(), 0.5)
    assert sync_trace(trace).comm.update_us_per_byte == 0.0
    assert apply_what_if(trace, mode="sync").comm.update_us_per_byte == 0.0
    assert apply_what_if(trace, compute_speedup=4).comm.update_us_per_byte == 0.125
    # A link what-if keeps it: the update is the cores' work.
    assert apply_what_if(trace, bandwidth_gbps=10).comm.update_us_per_byte == 0.5


# The comm model's optional per-byte costs of the runtime's completion thread: the update, and
# the copy-back of fused units (tests/test_copy_back.py).
PER_BYTE_FIELDS = ("update_us_per_byte", "copy_us_per_byte")


@pytest.mark.parametrize("field", PER_BYTE_FIELDS)
def test_the_field_round_trips_and_old_files_load(tmp_path: Path, field: str) -> None:
    path = tmp_path / "t.json"
    given = tiny()
    save_trace(
        dataclasses.replace(given, comm=dataclasses.replace(given.comm, **{field: 0.25})), path
    )
    assert json.loads(path.read_text())["comm"][field] == 0.25
    assert getattr(load_trace(path).comm, field) == 0.25
    save_trace(tiny(), path)
    assert field not in json.loads(path.read_text())["comm"]
    assert getattr(load_trace(path).comm, field) == 0.0


@pytest.mark.parametrize("field", PER_BYTE_FIELDS)
@pytest.mark.parametrize("value", [-1.0, "fast", 1e9])
def test_a_bad_update_cost_names_its_field(tmp_path: Path, value: object, field: str) -> None:
    path = tmp_path / "t.json"
    save_trace(tiny(), path)
    obj = json.loads(path.read_text())
    obj["comm"][field] = value
    path.write_text(json.dumps(obj))
    with pytest.raises(InputError) as err:
        load_trace(path)
    assert err.value.field == f"comm.{field}"
