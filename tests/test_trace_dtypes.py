"""The trace records each gradient's dtype (``Tensor.dtype``, trace format ``tensors[].dtype``):
`pace profile` and `pace import` write it, the file round-trips it, the verifier holds it to
``element_bytes``, the digest covers it (and is unchanged for traces without it), and a schedule
whose unit mixes two dtypes is refused before the runtime ever sees it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings

from pace.errors import InputError
from pace.io import load_trace, save_trace, trace_digest, trace_from_dict
from pace.ir import DTYPE_ELEMENT_BYTES, Schedule, Slice, Trace, Unit
from pace.verify import verify_schedule, verify_trace
from tests.strategies import typed_traces

DATA = Path(__file__).parent / "data"
TINY = DATA / "tiny.trace.json"
TINY_SCHEDULE = DATA / "tiny.schedule.json"


def _typed_tiny(dtypes: tuple[str, str]) -> Trace:
    """The tiny trace with its two tensors in ``dtypes`` (sizes made whole elements)."""
    base = load_trace(TINY)
    tensors = tuple(
        dataclasses.replace(
            t,
            dtype=d,
            element_bytes=DTYPE_ELEMENT_BYTES[d],
            size_bytes=t.size_bytes * DTYPE_ELEMENT_BYTES[d],
        )
        for t, d in zip(base.tensors, dtypes, strict=True)
    )
    return dataclasses.replace(base, tensors=tensors)


@settings(max_examples=30, deadline=None)
@given(trace=typed_traces())
def test_dtypes_round_trip_and_join_the_digest(
    tmp_path_factory: pytest.TempPathFactory, trace: Trace
) -> None:
    path = tmp_path_factory.mktemp("dt") / "t.json.gz"
    save_trace(trace, path)
    back = load_trace(path)
    assert [t.dtype for t in back.tensors] == [t.dtype for t in trace.tensors]
    assert trace_digest(back) == trace_digest(trace)
    # The dtype is part of what a schedule was compiled for: another dtype, another digest.
    first = back.tensors[0]
    other = (
        "bfloat16" if first.dtype == "float16" else "float16" if first.element_bytes == 2 else ""
    )
    changed = dataclasses.replace(
        back, tensors=(dataclasses.replace(first, dtype=other), *back.tensors[1:])
    )
    assert trace_digest(changed) != trace_digest(back)


def test_a_trace_without_dtypes_keeps_its_digest() -> None:
    # tests/data/tiny.schedule.json was compiled before dtypes were recorded: its trace digest
    # still matches the trace it was compiled from, so every older schedule keeps loading.
    schedule_obj = json.loads(TINY_SCHEDULE.read_text())
    trace = load_trace(TINY)
    assert all(t.dtype == "" for t in trace.tensors)
    assert schedule_obj["trace_digest"] == trace_digest(trace)
    assert "dtype" not in json.dumps(json.loads(TINY.read_text())["tensors"])


@pytest.mark.parametrize(
    ("dtype", "element_bytes", "message"),
    [
        (
            "float16",
            4,
            r"tensors\[0\]\.dtype: float16 has 2-byte elements but element_bytes is 4: "
            "set element_bytes to 2",
        ),
        ("float32", 1, r"tensors\[0\]\.dtype: float32 has 4-byte elements but element_bytes is 1"),
        ("x" * 65, 1, r"tensors\[0\]\.dtype: must be a dtype name of at most 64 characters"),
    ],
)
def test_a_dtype_that_disagrees_with_its_element_size_is_refused(
    dtype: str, element_bytes: int, message: str
) -> None:
    obj = json.loads(TINY.read_text())
    obj["tensors"][0]["dtype"] = dtype
    obj["tensors"][0]["element_bytes"] = element_bytes
    obj["tensors"][0]["bytes"] = 40
    with pytest.raises(InputError, match=message):
        verify_trace(trace_from_dict(obj))


def test_a_dtype_is_a_string_in_the_file() -> None:
    obj = json.loads(TINY.read_text())
    obj["tensors"][0]["dtype"] = 16
    with pytest.raises(InputError, match=r"tensors\[0\]\.dtype: must be a string"):
        trace_from_dict(obj)


def test_a_dtype_torch_may_add_later_is_taken_by_name() -> None:
    obj = json.loads(TINY.read_text())
    obj["tensors"][0]["dtype"] = "float4_e2m1fn_x2"  # not in DTYPE_ELEMENT_BYTES
    trace = trace_from_dict(obj)
    verify_trace(trace)
    assert trace.tensors[0].fusion_kind == (1, "float4_e2m1fn_x2")


def _one_unit(trace: Trace) -> Schedule:
    from pace.compiler import compile_trace

    compiled = compile_trace(trace).schedule
    whole = tuple(
        Slice(tensor=t.name, offset_bytes=0, size_bytes=t.size_bytes) for t in trace.tensors
    )
    return dataclasses.replace(compiled, units=(Unit(priority=0.0, slices=whole),))


def test_a_unit_that_mixes_dtypes_is_refused_by_the_verifier() -> None:
    trace = _typed_tiny(("float16", "bfloat16"))
    with pytest.raises(
        InputError,
        match=r"units\[0\]: a unit is all-reduced as one buffer of one dtype, this one mixes "
        r"bfloat16 \('layer1.weight'\), float16 \('layer2.weight'\)",
    ):
        verify_schedule(_one_unit(trace), trace)
    same = _typed_tiny(("float16", "float16"))
    verify_schedule(_one_unit(same), same)


def test_a_unit_that_mixes_element_sizes_of_an_older_trace_is_refused() -> None:
    base = load_trace(TINY)
    tensors = (dataclasses.replace(base.tensors[0], element_bytes=2), base.tensors[1])
    trace = dataclasses.replace(base, tensors=tensors)
    with pytest.raises(
        InputError,
        match=r"mixes 1-byte elements \('layer1.weight'\), 2-byte elements \('layer2.weight'\)",
    ):
        verify_schedule(_one_unit(trace), trace)


class _ThreePrecisions:
    """A model that keeps a float16 layer, a bfloat16 layer, another float16 layer and a float32
    head, each input cast to its layer's dtype (float16 and bfloat16 side by side on the
    ready-time chain: one element size, two dtypes)."""

    def __init__(self) -> None:
        import torch

        torch.manual_seed(0)
        nn = torch.nn

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.a = nn.Linear(16, 32).half()
                self.b = nn.Linear(32, 32).bfloat16()
                self.c = nn.Linear(32, 32).half()
                self.head = nn.Linear(32, 4)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                h = torch.relu(self.a(x.half()))
                h = torch.relu(self.b(h.bfloat16()))
                h = torch.relu(self.c(h.half()))
                return self.head(h.float())

        self.model = Net()
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        self.step_fn = lambda m: torch.nn.functional.cross_entropy(m(x), y)
        self.dtypes = {
            n: str(p.dtype).removeprefix("torch.") for n, p in self.model.named_parameters()
        }


@pytest.mark.torch
def test_pace_profile_and_pace_import_record_each_gradients_dtype(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from pace.importer import import_trace, record
    from pace.profiler import profile

    net = _ThreePrecisions()
    profiled = profile(net.model, net.step_fn, iters=1, warmup=1, calibrate=0)
    assert {t.name: t.dtype for t in profiled.tensors} == net.dtypes
    files = record(
        net.model,
        net.step_fn,
        kineto=tmp_path / "kineto.json",
        execution_trace=tmp_path / "et.json",
        parameters=tmp_path / "params.json",
        iters=1,
        warmup=1,
    )
    imported = import_trace(files.kineto, execution_trace=files.execution_trace).trace
    assert {t.name: t.dtype for t in imported.tensors} == net.dtypes
    for trace in (profiled, imported):
        verify_trace(trace)
        assert {t.element_bytes for t in trace.tensors if t.dtype == "bfloat16"} == {2}


def test_the_timeline_names_a_bfloat16_unit_as_nccl_does() -> None:
    # Element size alone reads 2 bytes as Half; the recorded dtype tells bfloat16 apart.
    from pace.compiler import compile_trace
    from pace.sim import schedule_policy, simulate
    from pace.timeline import build_timeline, to_chrome

    trace = _typed_tiny(("float16", "bfloat16"))
    run = simulate(trace, schedule_policy(compile_trace(trace).schedule))
    chrome = to_chrome(build_timeline(trace, {"pace": run}), trace=trace)
    units = {
        tuple(e["args"]["tensors"]): (e["name"].split("_RING")[0], e["args"]["dtype"])
        for e in chrome["traceEvents"]
        if e.get("cat") == "comm"
    }
    assert units == {
        ("layer1.weight",): ("ncclDevKernel_AllReduce_Sum_bf16", "BFloat16"),
        ("layer2.weight",): ("ncclDevKernel_AllReduce_Sum_f16", "Half"),
    }
