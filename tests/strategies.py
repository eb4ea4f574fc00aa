"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import strategies as st

from pace.ir import DTYPE_ELEMENT_BYTES, Schedule, Trace
from pace.synth import (
    MIN_OPS_PER_LAYER,
    SKIP_PROB_CHOICES,
    TENSORS_PER_LAYER_CHOICES,
    random_trace,
)


@st.composite
def traces(
    draw: st.DrawFn,
    *,
    max_layers: int = 12,
    integer: bool = False,
    max_ops_per_layer: int = 4,
) -> Trace:
    """Random valid DNN-like traces (see ``pace.synth.random_trace``)."""
    return random_trace(
        seed=draw(st.integers(0, 2**32 - 1)),
        n_layers=draw(st.integers(1, max_layers)),
        tensors_per_layer=draw(st.sampled_from(TENSORS_PER_LAYER_CHOICES)),
        ops_per_layer=draw(st.integers(MIN_OPS_PER_LAYER, max_ops_per_layer)),
        skip_prob=draw(st.sampled_from(SKIP_PROB_CHOICES)),
        integer=integer,
    )


@st.composite
def typed_traces(draw: st.DrawFn, *, max_layers: int = 6, min_bytes: int = 0) -> Trace:
    """Random traces whose tensors are float32, float16 or bfloat16 (drawn per tensor: a model
    that keeps some layers in another precision; float16 and bfloat16 have one element size),
    each at least ``min_bytes`` plus one element long."""
    trace = draw(traces(max_layers=max_layers))
    n = len(trace.tensors)
    dtypes = draw(
        st.lists(st.sampled_from(["float32", "float16", "bfloat16"]), min_size=n, max_size=n)
    )
    tensors = tuple(
        dataclasses.replace(
            t,
            element_bytes=(w := DTYPE_ELEMENT_BYTES[d]),
            dtype=d,
            size_bytes=(t.size_bytes // w + 1) * w + min_bytes,
        )
        for t, d in zip(trace.tensors, dtypes, strict=True)
    )
    return dataclasses.replace(trace, tensors=tensors)


def integer_traces(max_layers: int = 8) -> st.SearchStrategy[Trace]:
    """Integer instances: alpha 0, beta 1, integer durations and sizes."""
    return traces(max_layers=max_layers, integer=True)


def shuffled_priorities(sched: Schedule, rnd: random.Random) -> Schedule:
    """``sched`` with its priorities 0, 1, ... in a random order (``st.randoms()`` draws
    ``rnd``): a schedule whose priorities are not its replay's start order."""
    prios = [float(p) for p in range(len(sched.units))]
    rnd.shuffle(prios)
    units = tuple(
        dataclasses.replace(u, priority=p) for u, p in zip(sched.units, prios, strict=True)
    )
    return dataclasses.replace(sched, units=units)
