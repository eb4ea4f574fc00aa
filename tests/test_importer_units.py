"""The importer's parts on synthetic inputs: GPU kernel time attributed to the launching op,
all-reduce samples (both NCCL kernel namings, gloo) fitted as ``pace.cost`` fits, data
dependencies from tensor ids (reused ids, in-place writes), tensor lists in execution traces,
the parameters file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.errors import InputError
from pace.importer.comm import measured_allreduces
from pace.importer.et import EtNode, TensorRef, _tensors
from pace.importer.kineto import load_kineto
from pace.importer.link import forward_flow
from pace.importer.params import ParamSpec, load_parameters, parameters_document
from pace.importer.steps import Step

# --- all-reduce samples ---------------------------------------------------------------------


def _kineto_file(tmp: Path, events: list[dict[str, Any]], **top: Any) -> Path:
    path = tmp / "k.json"
    path.write_text(json.dumps({"traceEvents": events, **top}))
    return path


def _nccl(
    name: str, ts: float, dur: float, ext: int, args: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": 0,
        "tid": 20,
        "args": {"External id": ext, "stream": 20, "device": 0, **(args or {})},
    }


STYLES = (
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
)


@settings(max_examples=40)
@given(
    alpha=st.floats(1.0, 500.0),
    beta=st.floats(1e-5, 1e-2),
    sizes=st.lists(st.integers(1, 1 << 20), min_size=2, max_size=6, unique=True),
    workers=st.integers(2, 64),
    where=st.sampled_from(["kernel", "launching op", "kernel name"]),
    style=st.sampled_from(STYLES),
)
def test_nccl_allreduces_are_fitted_like_pace_cost_fits_them(
    tmp_path_factory: pytest.TempPathFactory,
    *,
    alpha: float,
    beta: float,
    sizes: list[int],
    workers: int,
    where: str,
    style: str,
) -> None:
    """Exact linear samples come back as the model they were made from, whichever NCCL kernel
    naming and wherever the profiler put the message size."""
    events: list[dict[str, Any]] = []
    for k, nelems in enumerate(sizes):
        ext = 100 + k
        meta = {"In msg nelems": nelems, "Group size": workers, "dtype": "Float"}
        if where == "kernel name":
            meta.pop("dtype")  # the element type then comes from the kernel's name
        host: dict[str, Any] = {"External id": ext, "Record function id": 0}
        kernel_args: dict[str, Any] = {}
        (host if where == "launching op" else kernel_args).update(meta)
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "record_param_comms",
                "ts": 10.0 * k,
                "dur": 5.0,
                "pid": 1,
                "tid": 1,
                "args": host,
            }
        )
        # Twice per size: the median of two equal samples is the sample.
        for rep in range(2):
            us = alpha + beta * 4 * nelems
            events.append(_nccl(style, 1000.0 * k + rep, us, ext, kernel_args))
    # A kernel of another collective is not an all-reduce sample.
    events.append(_nccl("ncclDevKernel_AllGather_RING_LL(...)", 5.0, 99.0, 999))
    samples = measured_allreduces(load_kineto(_kineto_file(tmp_path_factory.mktemp("n"), events)))
    assert samples.source == "nccl"
    assert samples.calls == 2 * len(sizes)
    assert [b for b, _ in samples.samples] == sorted(4 * n for n in sizes)
    assert samples.workers == workers
    assert samples.model is not None
    assert samples.note == ""
    assert samples.model.alpha_us == pytest.approx(alpha, rel=1e-6, abs=1e-6)
    assert samples.model.beta_us_per_byte == pytest.approx(beta, rel=1e-6)
    assert samples.model.samples == samples.samples


def test_gloo_allreduces_and_the_world_size(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "gloo:all_reduce",
            "ts": float(k),
            "dur": 100.0 + k,
            "pid": 1,
            "tid": 7,
            "args": {"Input Dims": [[n]], "Input type": ["float"], "Record function id": 0},
        }
        for k, n in enumerate([1024, 1024, 1024, 65536])
    ]
    got = measured_allreduces(
        load_kineto(_kineto_file(tmp_path, events, distributedInfo={"world_size": 2}))
    )
    assert got.source == "gloo"
    assert got.samples == ((4096, 101.0), (262144, 103.0))  # the median of 100, 101, 102
    assert got.workers == 2
    assert got.model is not None


def test_one_size_or_no_group_size_is_reported_not_fitted(tmp_path: Path) -> None:
    one = [_nccl(STYLES[1], 0.0, 50.0, 1, {"In msg nelems": 8, "dtype": "Float"})]
    got = measured_allreduces(load_kineto(_kineto_file(tmp_path, one)))
    assert got.model is None
    assert "group size" in got.note
    two = [{**one[0], "args": {**one[0]["args"], "Group size": 4}}]
    got = measured_allreduces(load_kineto(_kineto_file(tmp_path, two)))
    assert got.model is None
    assert "1 size(s) only" in got.note
    assert got.samples == ((32, 50.0),)
    none = measured_allreduces(load_kineto(_kineto_file(tmp_path, [])))
    assert none.source == ""
    assert none.note == "no all-reduce in the Kineto trace"


def test_malformed_kineto_events_name_the_field(tmp_path: Path) -> None:
    bad = [{"ph": "X", "name": "aten::mm", "ts": "soon", "dur": 1}]
    with pytest.raises(InputError, match=r"traceEvents\[0\]\.ts: must be a finite number"):
        load_kineto(_kineto_file(tmp_path, bad))
    neg = [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": -1}]
    with pytest.raises(InputError, match=r"traceEvents\[0\]\.dur: must be >= 0"):
        load_kineto(_kineto_file(tmp_path, neg))


# --- data dependencies from tensor ids ------------------------------------------------------


def _node(i: int, reads: list[int], writes: list[int]) -> EtNode:
    def ref(t: int) -> TensorRef:
        return TensorRef(tensor_id=t, storage_id=t, numel=1, itemsize=4, shape=(1,), dtype="float")

    return EtNode(
        id=i,
        name="aten::op",
        parent=0,
        rf_id=i,
        seq=-1,
        scope=0,
        tid=1,
        inputs=tuple(ref(t) for t in reads),
        outputs=tuple(ref(t) for t in writes),
    )


@st.composite
def programs(draw: st.DrawFn) -> tuple[list[EtNode], list[set[int]], set[int]]:
    """A random straight-line program over tensors whose ids get reused once dead (as the
    observer's ids, which follow addresses, do), with some in-place writes; and the true
    producers of each op's inputs, tracked by object, not by id."""
    n_ops = draw(st.integers(1, 25))
    live: dict[int, int | None] = dict.fromkeys(range(3))  # id -> producing op (None: leaf)
    free_ids: list[int] = []
    next_id = 3
    nodes: list[EtNode] = []
    truth: list[set[int]] = []
    leaves: set[int] = set()
    for i in range(n_ops):
        ids = sorted(live)
        reads = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True))
        truth.append({p for t in reads if (p := live[t]) is not None})
        leaves |= {t for t in reads if live[t] is None}
        if draw(st.booleans()) and len(ids) > 3:  # in place: the first input is written
            writes = [reads[0]]
        else:
            if free_ids and draw(st.booleans()):
                new = free_ids.pop()
            else:
                new, next_id = next_id, next_id + 1
            writes = [new]
        for t in writes:
            live[t] = i
        # Some tensor dies; its id may come back for a later, unrelated tensor.
        dead = [t for t in live if t not in reads and t not in writes and t >= 3]
        if dead and draw(st.booleans()):
            t = draw(st.sampled_from(dead))
            del live[t]
            free_ids.append(t)
        nodes.append(_node(i + 1, reads, writes))
    return nodes, truth, leaves


@given(programs())
def test_each_op_depends_on_the_last_writer_of_what_it_reads(
    program: tuple[list[EtNode], list[set[int]], set[int]],
) -> None:
    nodes, truth, leaves = program
    step = Step(
        label="s",
        forward=tuple(nodes),
        forward_start_us=tuple(0.0 for _ in nodes),
        forward_own_us=tuple(0.0 for _ in nodes),
        backward=(),
        accumulate=(),
        engine=(),
        optimizer=(),
        forward_begin_us=0.0,
        forward_end_us=1.0,
        backward_end_us=2.0,
        optimizer_us=0.0,
        after_backward_ops=0,
    )
    flow = forward_flow(step)
    assert [set(d) for d in flow.deps] == truth
    # Leaves (parameters, inputs) are exactly the tensors read before anything wrote them.
    assert {t for t, _ in flow.leaves} == leaves


# --- execution-trace values -----------------------------------------------------------------


def test_tensor_lists_and_optional_tensors_are_flattened_in_order() -> None:
    t1 = [10, 11, 0, 6, 4, "cpu"]
    t2 = [12, 13, 0, 2, 2, "cpu"]
    raw = {
        "values": [t1, [[t2, t1]], "<None>", 3, [5, 4]],
        "shapes": [[2, 3], [[[2], [2, 3]]], [], [], [[], []]],
        "types": [
            "Tensor(float)",
            "GenericList[GenericList[Tensor(c10::Half),Tensor(float)]]",
            "None",
            "Int",
            "GenericList[Int,Int]",
        ],
    }
    got = _tensors(raw, "e.json", "nodes[0].inputs", "1.1.1")
    assert [(t.tensor_id, t.shape, t.dtype, t.size_bytes) for t in got] == [
        (10, (2, 3), "float", 24),
        (12, (2,), "c10::Half", 4),
        (10, (2, 3), "float", 24),
    ]
    with pytest.raises(InputError, match=r"nodes\[0\]\.inputs: values, shapes and types differ"):
        _tensors({"values": [t1], "shapes": [], "types": []}, "e.json", "nodes[0].inputs", "")


def test_parameters_file_round_trip(tmp_path: Path) -> None:
    specs = [
        ParamSpec(name="conv.weight", shape=(8, 3, 3, 3), element_bytes=4),
        ParamSpec(name="frozen", shape=(3,), element_bytes=2, requires_grad=False),
    ]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(parameters_document(specs, buffers=["bn.running_mean"])))
    assert load_parameters(path) == specs
    assert specs[0].size_bytes == 864
    doc = parameters_document([*specs, specs[0]])
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"parameters\[2\]\.name: name 'conv.weight' repeated"):
        load_parameters(path)


def test_the_importer_imports_without_torch() -> None:
    """`pace --help` and reading the files must not need torch (docs/design.md, import rules)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import pace.importer, pace.importer.agree, pace.cli.import_cmd\n"
        "from pace.cli import main\n"
        "sys.exit(main(['import', 'k.json', '--execution-trace', 'e.json', '-o', 'o.json']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "pace: torch is not installed (pip install 'pace[profile]')\n"
