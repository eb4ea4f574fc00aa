"""Property tests of the simulator on random DNN-like traces."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.analysis import analyze
from pace.compiler import best_lower_bound_us
from pace.ir import Trace, Unit
from pace.sim import (
    POLICIES,
    SimOptions,
    SimResult,
    simulate,
    units_policy,
)
from pace.sim.core import _simulate
from pace.sim.policies import (
    bytescheduler,
    ddp,
    ddp_buckets,
    horovod,
    layer_order,
    partition_units,
    resolve_policy,
)
from tests.strategies import traces, typed_traces

FAST_POLICIES = [n for n in POLICIES if n != "bytescheduler-tuned"]
EPS = 1e-6


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def one_unit_per_tensor_in_ready_order(trace: Trace) -> tuple[Unit, ...]:
    prep = analyze(trace)
    return partition_units(prep, prep.ready_order, max(prep.size_bytes))


def check_timeline(trace: Trace, res: SimResult) -> None:
    """An independent check that a replay obeys the contract (ideal compute, credit 1)."""
    prep = analyze(trace)
    start, finish = res.op_start_us, res.op_finish_us
    # Units: start after all their tensors were produced, never overlap, and when one starts
    # no unit with a smaller priority was ready and waiting.
    ready = []
    for unit in res.units:
        ready.append(max(prep.release_us[prep.tensor_index[s.tensor]] for s in unit.slices))
    spans = sorted(zip(res.unit_start_us, res.unit_finish_us, range(len(res.units)), strict=True))
    for (_, f0, _), (s1, _, _) in itertools.pairwise(spans):
        assert s1 >= f0 - EPS
    for s, _, u in spans:
        assert s >= ready[u] - EPS
        for v, other in enumerate(res.units):
            waiting = ready[v] <= s + EPS and res.unit_start_us[v] > s + EPS
            if waiting:
                assert (other.priority, v) > (res.units[u].priority, u)
    # Tensors: done when the last unit carrying them is.
    for k, name in enumerate(prep.tensor_names):
        ends = [
            res.unit_finish_us[u]
            for u, unit in enumerate(res.units)
            if any(s.tensor == name for s in unit.slices)
        ]
        assert close(res.tensor_done_us[k], max(ends))
    # Ops: start as soon as deps and consumed tensors are done (ideal compute).
    for i, op in enumerate(trace.ops):
        earliest = max(
            [finish[prep.op_index[d]] for d in op.deps]
            + [res.tensor_done_us[k] for k in prep.consumes[i]]
            + [0.0]
        )
        if res.options.barrier and prep.gated[i]:
            earliest = max(earliest, res.comm_end_us)
        assert close(start[i], earliest)
        assert close(finish[i], start[i] + op.duration_us)
    assert close(res.iteration_us, max([*finish, *res.unit_finish_us]))


@settings(max_examples=40)
@given(traces())
def test_every_policy_is_at_least_the_lower_bound(trace: Trace) -> None:
    bound, _ = best_lower_bound_us(trace)
    cp = analyze(trace).critical_path_us
    for name in FAST_POLICIES:
        res = simulate(trace, name)
        assert res.iteration_us >= cp - EPS, name
        assert res.iteration_us >= bound - EPS * max(1.0, bound), name


@settings(max_examples=10)
@given(traces(max_layers=5))
def test_tuned_bytescheduler_is_at_least_the_bound_and_at_most_the_default(trace: Trace) -> None:
    tuned = simulate(trace, "bytescheduler-tuned")
    assert tuned.iteration_us >= analyze(trace).critical_path_us - EPS
    assert tuned.iteration_us <= simulate(trace, bytescheduler()).iteration_us + EPS


@settings(max_examples=60)
@given(traces())
def test_one_unit_per_tensor_in_ready_order_equals_fifo_without_barrier(trace: Trace) -> None:
    replay = simulate(trace, units_policy(one_unit_per_tensor_in_ready_order(trace)))
    fifo = simulate(trace, "fifo", options=SimOptions(barrier=False))
    assert replay.iteration_us == fifo.iteration_us
    assert replay.unit_start_us == fifo.unit_start_us


@settings(max_examples=30)
@given(traces())
def test_simulation_is_deterministic(trace: Trace) -> None:
    # A structurally equal but distinct trace object must give the same answer (cache by id).
    twin = dataclasses.replace(trace, ops=tuple(trace.ops))
    for name in FAST_POLICIES:
        a = simulate(trace, name)
        b = simulate(twin, name)
        assert a == b, name
        assert a.op_start_us == b.op_start_us


@settings(max_examples=30)
@given(traces())
def test_explicit_credit_one_equals_default(trace: Trace) -> None:
    for name in ("fifo", "tictac", "p3"):
        assert simulate(trace, name) == simulate(trace, name, options=SimOptions(credit=1))


@settings(max_examples=40)
@given(traces(), st.booleans())
def test_replays_obey_the_contract(trace: Trace, barrier: bool) -> None:
    opts = SimOptions(barrier=barrier)
    for name in ("fifo", "tictac", "p3", "ddp", "horovod"):
        check_timeline(trace, simulate(trace, name, options=opts))


@settings(max_examples=40)
@given(traces(), st.booleans(), st.integers(1, 4))
def test_fast_path_equals_event_loop(trace: Trace, barrier: bool, credit: int) -> None:
    for name in ("fifo", "tictac", "p3", "ddp", "bytescheduler"):
        opts = SimOptions(barrier=barrier, credit=credit)
        fast = simulate(trace, name, options=opts)
        slow = _simulate(trace, resolve_policy(name), options=opts, force_event_loop=True)
        assert close(fast.iteration_us, slow.iteration_us), name
        assert all(
            close(a, b) for a, b in zip(fast.tensor_done_us, slow.tensor_done_us, strict=True)
        )
        assert all(close(a, b) for a, b in zip(fast.op_start_us, slow.op_start_us, strict=True))
    for sync in (True, False):
        pol = horovod(threshold_bytes=1 << 20, cycle_us=50.0, synchronous=sync)
        fast = simulate(trace, pol, options=SimOptions(barrier=barrier))
        slow = _simulate(trace, pol, options=SimOptions(barrier=barrier), force_event_loop=True)
        assert close(fast.iteration_us, slow.iteration_us)


@settings(max_examples=40)
@given(traces())
def test_barrier_never_helps_under_ideal_compute(trace: Trace) -> None:
    for name in ("tictac", "p3", "bytescheduler"):
        free = simulate(trace, name, options=SimOptions(barrier=False)).iteration_us
        held = simulate(trace, name, options=SimOptions(barrier=True)).iteration_us
        assert held >= free - EPS, name


@settings(max_examples=40)
@given(traces())
def test_one_compute_stream_runs_ops_one_at_a_time(trace: Trace) -> None:
    res = simulate(trace, "tictac", options=SimOptions(one_compute_stream=True))
    spans = sorted(zip(res.op_start_us, res.op_finish_us, strict=True))
    for (_, f0), (s1, _) in itertools.pairwise(spans):
        assert s1 >= f0 - EPS
    assert res.iteration_us >= sum(op.duration_us for op in trace.ops) - EPS


@settings(max_examples=30)
@given(traces(), st.integers(1, 5))
def test_processor_sharing_conserves_work(trace: Trace, credit: int) -> None:
    # With shared bandwidth the channel never carries more than one unit's worth at a time, so
    # busy time >= total unit cost, with equality when the channel never idles mid-unit.
    res = simulate(trace, "bytescheduler", options=SimOptions(credit=credit))
    comm = trace.comm
    work = sum(comm.cost_us(u.size_bytes) for u in res.units)
    assert res.comm_busy_us == pytest.approx(work, rel=1e-6, abs=1e-6)


@settings(max_examples=20)
@given(traces())
def test_layer_order_sorts_by_first_forward_use(trace: Trace) -> None:
    prep = analyze(trace)
    order = layer_order(prep)
    needs = [prep.need_us[k] for k in order]
    assert needs == sorted(needs)


@settings(max_examples=25)
@given(traces(max_layers=8), st.booleans())
def test_every_policy_runs_on_one_compute_stream(trace: Trace, barrier: bool) -> None:
    serial_us = sum(op.duration_us for op in trace.ops)
    opts = SimOptions(one_compute_stream=True, barrier=barrier)
    for name in FAST_POLICIES:
        res = simulate(trace, name, options=opts)
        assert res.iteration_us >= serial_us - EPS, name
        assert all(math.isfinite(d) for d in res.tensor_done_us), name
        assert close(res.iteration_us, max([*res.op_finish_us, *res.unit_finish_us])), name


@settings(max_examples=40)
@given(traces(), st.integers(1, 1 << 26), st.sampled_from([None, 2, 3]))
def test_byte_window_fast_path_equals_event_loop(
    trace: Trace, window: int, credit: int | None
) -> None:
    pol = bytescheduler(partition_bytes=1 << 20, credit_bytes=window, window="bytes")
    opts = SimOptions(credit=credit)
    fast = simulate(trace, pol, options=opts)
    slow = _simulate(trace, pol, options=opts, force_event_loop=True)
    assert close(fast.iteration_us, slow.iteration_us)
    assert all(close(a, b) for a, b in zip(fast.unit_start_us, slow.unit_start_us, strict=True))
    assert fast.iteration_us >= analyze(trace).critical_path_us - EPS


@settings(max_examples=40)
@given(traces(), st.integers(0, 1 << 24), st.sampled_from([0.0, 100.0, 5000.0]), st.booleans())
def test_horovod_fusion_groups_cover_each_tensor_once_within_threshold(
    trace: Trace, threshold: int, cycle_us: float, sync: bool
) -> None:
    res = simulate(trace, horovod(threshold_bytes=threshold, cycle_us=cycle_us, synchronous=sync))
    names = [s.tensor for u in res.units for s in u.slices]
    assert sorted(names) == sorted(t.name for t in trace.tensors)
    for u in res.units:
        assert len(u.slices) == 1 or u.size_bytes <= threshold
    # Fused in ready order: each unit's tensors are produced no later than the next unit's.
    prep = analyze(trace)
    rank = {prep.tensor_names[k]: r for r, k in enumerate(prep.ready_order)}
    flat = [rank[n] for n in names]
    assert flat == sorted(flat)
    # One at a time, never before its tensors exist.
    for u, s0 in zip(res.units, res.unit_start_us, strict=True):
        assert s0 >= max(prep.release_us[prep.tensor_index[s.tensor]] for s in u.slices) - EPS


@settings(max_examples=40)
@given(traces(), st.integers(1, 1 << 24), st.integers(1, 1 << 22))
def test_ddp_buckets_are_ready_order_runs_closed_at_their_limit(
    trace: Trace, cap: int, first: int
) -> None:
    prep = analyze(trace)
    buckets = ddp_buckets(prep, prep.ready_order, cap_bytes=cap, first_bytes=first)
    assert [k for b in buckets for k in b] == list(prep.ready_order)
    for i, b in enumerate(buckets[:-1]):
        size = sum(prep.size_bytes[k] for k in b)
        limit = first if i == 0 else cap
        assert size >= limit
        assert size - prep.size_bytes[b[-1]] < limit
    res = simulate(trace, ddp(bucket_cap_bytes=cap, first_bucket_bytes=first))
    # Issued strictly in bucket order.
    assert list(res.unit_start_us) == sorted(res.unit_start_us)


@settings(max_examples=40)
@given(typed_traces(), st.integers(1, 1 << 24), st.integers(1, 1 << 22))
def test_ddp_buckets_hold_one_dtype_each_closed_at_its_own_limit(
    trace: Trace, cap: int, first: int
) -> None:
    # DDP's reducer keeps one open bucket per dtype: per dtype, the buckets are the runs of the
    # ready order's tensors of that dtype, each closed at its dtype's first or later limit
    # (float16 and bfloat16, of one element size, apart).
    prep = analyze(trace)
    buckets = ddp_buckets(prep, prep.ready_order, cap_bytes=cap, first_bytes=first)
    assert sorted(k for b in buckets for k in b) == sorted(prep.ready_order)
    position = {k: i for i, k in enumerate(prep.ready_order)}
    closed: set[int] = set()  # ids of the buckets that reached their limit
    for kind in set(prep.fusion_kind):
        mine = [b for b in buckets if prep.fusion_kind[b[0]] == kind]
        assert all(prep.fusion_kind[k] == kind for b in mine for k in b)
        walk = [k for k in prep.ready_order if prep.fusion_kind[k] == kind]
        assert [k for b in mine for k in b] == walk
        for i, b in enumerate(mine):
            limit = first if i == 0 else cap
            total = sum(prep.size_bytes[k] for k in b)
            assert total - prep.size_bytes[b[-1]] < limit
            if total >= limit:
                closed.add(id(b))
            else:
                assert i == len(mine) - 1  # only a dtype's last bucket is left open
    # The closed buckets in the order they closed (their last tensor), then the open ones in the
    # order of their first tensor.
    flags = [id(b) in closed for b in buckets]
    assert flags == sorted(flags, reverse=True)
    shut = [position[b[-1]] for b, f in zip(buckets, flags, strict=True) if f]
    left = [position[b[0]] for b, f in zip(buckets, flags, strict=True) if not f]
    assert shut == sorted(shut)
    assert left == sorted(left)
