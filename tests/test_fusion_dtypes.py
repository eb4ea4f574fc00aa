"""A fused unit carries one dtype: the runtime all-reduces it as one buffer and refuses a unit
that mixes dtypes (pace.runtime.plan). So no fusion method groups tensors of two dtypes (told
apart by ``Tensor.fusion_kind``: element size and the dtype the trace records, so float16 and
bfloat16 too), and every schedule the compiler writes for a model that keeps some layers in
another precision (a float16 body beside a float32 head) is one the runtime loads."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.compiler import compile_trace
from pace.fusion import build_chain, plan_fusion
from pace.ir import Schedule, ScheduleMode, Trace
from pace.options import FusionMethod
from pace.runtime.plan import ParamInfo, plan_from_schedule
from pace.synth import random_trace
from pace.verify import verify_schedule
from tests.strategies import typed_traces


def _kinds_per_unit(trace: Trace, schedule: Schedule) -> list[set[tuple[int, str]]]:
    kind = {t.name: t.fusion_kind for t in trace.tensors}
    return [{kind[s.tensor] for s in u.slices} for u in schedule.units]


def _halved(trace: Trace, every: int) -> Trace:
    """``trace`` with every ``every``-th tensor float16, the rest float32."""
    tensors = tuple(
        dataclasses.replace(
            t, element_bytes=2 if i % every == 0 else 4, size_bytes=4 * t.size_bytes
        )
        for i, t in enumerate(trace.tensors)
    )
    return dataclasses.replace(trace, tensors=tensors)


@settings(max_examples=40, deadline=None)
@given(trace=typed_traces(), method=st.sampled_from(["paper", "search"]))
def test_no_fusion_group_mixes_dtypes(trace: Trace, method: str) -> None:
    kind = {t.name: t.fusion_kind for t in trace.tensors}
    plan = plan_fusion(trace, method=method)
    assert all(len({kind[n] for n in g}) == 1 for g in plan.groups)
    assert plan.details["n_groups"] == len(plan.groups)
    assert sorted(n for g in plan.groups for n in g) == sorted(kind)


@settings(max_examples=25, deadline=None)
@given(
    trace=typed_traces(),
    mode=st.sampled_from(["overlap", "sync"]),
    fusion=st.sampled_from(["search", "paper", "none"]),
)
def test_compiled_units_carry_one_dtype(
    trace: Trace, mode: ScheduleMode, fusion: FusionMethod
) -> None:
    schedule = compile_trace(trace, mode=mode, fusion=fusion).schedule
    assert all(len(kinds) == 1 for kinds in _kinds_per_unit(trace, schedule))
    verify_schedule(schedule, trace)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_latency_bound_link_still_fuses_within_each_precision(seed: int) -> None:
    # A per-call cost this large fuses everything into one unit on a one-dtype trace; with the
    # precisions interleaved on the ready-time chain the fusion cuts at every change, and the
    # order search joins the runs of each precision again: one unit per element size.
    base = random_trace(seed=seed, n_layers=8, alpha_us=1e6)
    assert len(compile_trace(base).schedule.units) == 1
    trace = _halved(base, 3)
    assert build_chain(trace).required_starts.size > 1  # interleaved, not two runs
    schedule = compile_trace(trace).schedule
    kinds = _kinds_per_unit(trace, schedule)
    assert sorted(k for u in kinds for k in u) == [(2, ""), (4, "")]
    params = [
        ParamInfo(
            name=t.name,
            numel=t.size_bytes // t.element_bytes,
            element_size=t.element_bytes,
            dtype="float16" if t.element_bytes == 2 else "float32",
        )
        for t in trace.tensors
    ]
    plan_from_schedule(schedule, params)  # the runtime loads it


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float16_and_bfloat16_are_never_fused_where_the_trace_records_them(seed: int) -> None:
    # One element size, two dtypes: only the trace's dtype tells them apart. On a link whose
    # one-dtype compile is one unit, the compile is one unit per dtype, and the runtime's plan
    # builder (which refuses a unit of two dtypes) loads it.
    base = random_trace(seed=seed, n_layers=8, alpha_us=1e6)
    tensors = tuple(
        dataclasses.replace(
            t,
            element_bytes=2,
            dtype="bfloat16" if i % 3 == 0 else "float16",
            size_bytes=2 * t.size_bytes,
        )
        for i, t in enumerate(base.tensors)
    )
    trace = dataclasses.replace(base, tensors=tensors)
    schedule = compile_trace(trace).schedule
    kinds = _kinds_per_unit(trace, schedule)
    assert all(len(k) == 1 for k in kinds)
    assert sorted(k for u in kinds for k in u) == [(2, "bfloat16"), (2, "float16")]
    params = [
        ParamInfo(name=t.name, numel=t.size_bytes // 2, element_size=2, dtype=t.dtype)
        for t in trace.tensors
    ]
    plan_from_schedule(schedule, params)  # the runtime loads it
