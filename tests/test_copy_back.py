"""The copy of a fused unit's reduced buffer back into its gradients (``comm.copy_us_per_byte``,
issue 15).

pace's runtime packs a unit of several pieces into one buffer, reduces it, and on its completion
thread copies the result back into the gradients before their update; the overlapped forward
and the synchronous ``backward()``'s return wait for that copy. A unit of one piece is reduced
in place and copies nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.analysis import analyze
from pace.compiler import apply_what_if, framework_path_us, sync_trace
from pace.io import load_trace
from pace.ir import Slice, Trace, Unit
from pace.replay import index_units, iteration_us, updated_us
from pace.sim import simulate
from pace.sim.core import Policy, units_policy
from tests.strategies import traces
from tests.test_update_cost import POLICIES, forced_event_loop, tiny, with_update

DATA = Path(__file__).parent / "data"


def with_copy(trace: Trace, per_byte: float) -> Trace:
    return dataclasses.replace(
        trace, comm=dataclasses.replace(trace.comm, copy_us_per_byte=per_byte)
    )


def whole(trace: Trace, *names: str) -> tuple[Slice, ...]:
    sizes = {t.name: t.size_bytes for t in trace.tensors}
    return tuple(Slice(tensor=n, offset_bytes=0, size_bytes=sizes[n]) for n in names)


def fused(trace: Trace) -> Policy:
    """tiny's two gradients in one unit (24 bytes, ready at 20, on the link 20..44)."""
    return units_policy((Unit(priority=0, slices=whole(trace, "layer2.weight", "layer1.weight")),))


def test_a_fused_unit_copies_back_before_the_forward_and_a_single_piece_does_not() -> None:
    base = simulate(tiny(), fused(tiny()))
    assert base.iteration_us == 54.0  # fw1 44..49, fw2 49..54
    # 24 bytes at 0.5 us each: the forward starts at 56.
    res = simulate(with_copy(tiny(), 0.5), fused(tiny()))
    assert res.tensor_done_us == (44.0, 44.0)  # the reduction's end, as without the copy
    assert res.op_start_us[2] == 56.0
    assert res.iteration_us == 66.0
    # The copy comes before the update on the same thread: 44 + 12 + 12.
    both = with_update(with_copy(tiny(), 0.5), 0.5)
    assert simulate(both, fused(tiny())).iteration_us == 78.0
    # One unit per gradient: each is reduced in place, nothing to copy (FIFO's 44 us).
    assert simulate(with_copy(tiny(), 0.5), "fifo").iteration_us == 44.0
    arrays = index_units(analyze(with_copy(tiny(), 0.5)), res.units)
    assert arrays.copy_us == (12.0,)
    # The event loop and the kernel the scheduler scores with agree.
    assert simulate(forced_event_loop(with_copy(tiny(), 0.5)), fused(tiny())).iteration_us == 66.0
    assert iteration_us(analyze(with_copy(tiny(), 0.5)), res.units) == 66.0


def test_the_sync_loop_waits_for_the_copy_but_not_the_framework_path() -> None:
    trace = with_update(with_copy(tiny(), 0.5), 0.5)
    sync = sync_trace(trace)
    assert sync.comm.copy_us_per_byte == 0.5  # backward() returns after the copy-back
    assert sync.comm.update_us_per_byte == 0.0  # and steps after it, outside the window
    assert simulate(sync, fused(tiny())).iteration_us == 66.0
    assert apply_what_if(trace, compute_speedup=4).comm.copy_us_per_byte == 0.125
    assert apply_what_if(trace, bandwidth_gbps=10).comm.copy_us_per_byte == 0.5


def test_copies_at_one_instant_come_before_that_instant_s_updates() -> None:
    # A unit finishing at 10 copies 3 us back, then its two tensors' update takes 10 us; the
    # tensor done at 12 waits for both, then takes its own 2 us.
    assert updated_us([10.0, 10.0, 12.0], [4, 6, 2], 1.0, [(10.0, 3.0)]) == [23.0, 23.0, 25.0]
    # A copy with no update: a unit that finishes no tensor (a tensor split over two units)
    # still occupies the thread.
    assert updated_us([12.0], [2], 0.0, [(10.0, 5.0), (12.0, 1.0)]) == [16.0]
    assert updated_us([12.0], [2], 0.0) == [12.0]


@settings(max_examples=60, deadline=None)
@given(
    trace=traces(max_layers=8),
    per_byte=st.floats(1e-4, 2.0),
    update=st.sampled_from([0.0, 0.3]),
    policy=st.sampled_from(POLICIES),
)
def test_the_fast_path_and_the_event_loop_agree_on_the_copy(
    trace: Trace, per_byte: float, update: float, policy: str
) -> None:
    """The copy is a pass over the units' ends on the fast path (``updated_us``) and work on the
    update thread of the event loop (``drive_joint``): the same model twice. It can only delay
    the window, by at most every fused unit's copy together."""
    slow = with_update(with_copy(trace, per_byte), update)
    fast = simulate(slow, policy)
    loop = simulate(forced_event_loop(slow), policy)
    assert fast.iteration_us == pytest.approx(loop.iteration_us, rel=1e-9, abs=1e-6)
    assert fast.op_start_us == pytest.approx(loop.op_start_us, rel=1e-9, abs=1e-6)
    free = simulate(with_update(trace, update), policy)
    copied = sum(u.size_bytes for u in fast.units if u.fused) * per_byte
    tol = 1e-6 * max(1.0, free.iteration_us)
    assert free.iteration_us - tol <= fast.iteration_us <= free.iteration_us + copied + tol


def test_horovod_s_own_path_pays_no_copy_of_pace_s() -> None:
    from pace.ir import FrameworkPath

    trace = load_trace(DATA / "tiny.trace.json")
    path = FrameworkPath(backend="horovod", alpha_us=0.0, beta_us_per_byte=1.0)
    plain = dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, framework=path))
    assert framework_path_us(with_copy(plain, 0.5)) == framework_path_us(plain)
