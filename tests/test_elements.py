"""Element sizes: a partition never splits an element (the runtime reduces whole elements)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings

from pace.compiler import compile_trace
from pace.errors import InputError
from pace.io import load_trace, save_trace, trace_digest
from pace.ir import Schedule, Slice, Trace, Unit
from pace.lp import schedule
from pace.verify import verify_schedule, verify_trace
from tests.strategies import traces

TINY = Path(__file__).parent / "data" / "tiny.trace.json"


def _with_elements(trace: Trace, element_bytes: int) -> Trace:
    return dataclasses.replace(
        trace,
        tensors=tuple(
            dataclasses.replace(t, element_bytes=element_bytes)
            for t in trace.tensors
            if t.size_bytes % element_bytes == 0
        ),
    )


def test_round_trip_and_digest(tmp_path: Path) -> None:
    tiny = load_trace(TINY)
    four = _with_elements(tiny, 4)
    path = tmp_path / "t.json"
    save_trace(four, path)
    assert load_trace(path) == four
    # Unknown element size (1) leaves the digest as it always was; a known one changes it.
    assert trace_digest(dataclasses.replace(tiny)) == trace_digest(tiny)
    assert trace_digest(four) != trace_digest(tiny)


def test_misaligned_slice_is_refused() -> None:
    four = _with_elements(load_trace(TINY), 4)
    units = (
        Unit(priority=0, slices=(Slice(tensor="layer2.weight", offset_bytes=0, size_bytes=10),)),
        Unit(priority=1, slices=(Slice(tensor="layer2.weight", offset_bytes=10, size_bytes=10),)),
        Unit(priority=2, slices=(Slice(tensor="layer1.weight", offset_bytes=0, size_bytes=4),)),
    )
    bad = Schedule(
        trace_digest=trace_digest(four),
        cost_model=four.comm,
        units=units,
        predicted_iteration_us=39.0,
    )
    with pytest.raises(InputError, match=r"units\[0\]\.slices\[0\].*element size 4"):
        verify_schedule(bad, four, where="s.json")


def test_tiny_optimum_preempts_on_an_element_boundary() -> None:
    # Byte-exact, layer2 is split at 10 of its 20 bytes. With 4-byte elements the split moves up
    # to 12: layer1 (ready at 20) now waits until 22 and is done at 26 instead of 24, fw.layer1
    # runs 26-31, and the rest of layer2 runs 26-34, so fw.layer2 still starts at 34: 39 us.
    four = _with_elements(load_trace(TINY), 4)
    verify_trace(four)
    sched = schedule(four, solver="exact").schedule
    verify_schedule(sched, four)
    first = next(u for u in sched.units if u.slices[0].tensor == "layer2.weight")
    assert first.slices[0].size_bytes == 12
    assert sched.predicted_iteration_us == 39.0


@settings(max_examples=40)
@given(traces(max_layers=10))
def test_compiled_schedules_are_element_aligned(trace: Trace) -> None:
    # synth's float traces have sizes in multiples of 4 bytes (float32 tensors).
    four = _with_elements(trace, 4)
    if len(four.tensors) != len(trace.tensors):
        return
    result = compile_trace(four, baselines=False)
    verify_schedule(result.schedule, four)  # raises on a split element or a coverage error
    unaligned = compile_trace(trace, baselines=False).predicted_iteration_us
    # Moving each boundary by < 4 bytes costs at most a few bytes' transfer time.
    slack_us = 4 * trace.comm.beta_us_per_byte * len(result.schedule.units) + 1e-6
    assert result.predicted_iteration_us <= unaligned * 1.005 + slack_us
