"""A fused unit carries one dtype: the runtime all-reduces it as one buffer and refuses a unit
that mixes element sizes (pace.runtime.plan). So no fusion method groups tensors of two element
sizes, and every schedule the compiler writes for a model that keeps some layers in another
precision (a float16 body beside a float32 head) is one the runtime loads."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.compiler import compile_trace
from pace.fusion import build_chain, plan_fusion
from pace.ir import Schedule, Trace
from pace.runtime.plan import ParamInfo, plan_from_schedule
from pace.synth import random_trace
from tests.strategies import typed_traces


def _sizes_per_unit(trace: Trace, schedule: Schedule) -> list[set[int]]:
    element = {t.name: t.element_bytes for t in trace.tensors}
    return [{element[s.tensor] for s in u.slices} for u in schedule.units]


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
def test_no_fusion_group_mixes_element_sizes(trace: Trace, method: str) -> None:
    element = {t.name: t.element_bytes for t in trace.tensors}
    plan = plan_fusion(trace, method=method)
    assert all(len({element[n] for n in g}) == 1 for g in plan.groups)
    assert plan.details["n_groups"] == len(plan.groups)
    assert sorted(n for g in plan.groups for n in g) == sorted(element)


@settings(max_examples=25, deadline=None)
@given(trace=typed_traces(), mode=st.sampled_from(["overlap", "sync"]))
def test_compiled_units_carry_one_element_size(trace: Trace, mode: str) -> None:
    schedule = compile_trace(trace, mode=mode).schedule
    assert all(len(sizes) == 1 for sizes in _sizes_per_unit(trace, schedule))


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
    sizes = _sizes_per_unit(trace, schedule)
    assert sorted(s for u in sizes for s in u) == [2, 4]
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
