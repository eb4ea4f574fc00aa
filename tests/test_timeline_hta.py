"""``pace timeline --format chrome`` is read by Holistic Trace Analysis as a rank's trace: the
ops are compute kernels, the all-reduce units NCCL communication kernels with the collective
args torch.profiler writes, and HTA's own analyses give the replay's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pace.cli import main
from pace.io import load_schedule, save_trace
from pace.sim import simulate
from pace.synth import random_trace

# Installed by `make test` (the dev extra); under PACE_REQUIRE_EXTRAS=1 a skip here fails.
pytest.importorskip("hta.trace_analysis")
from hta.trace_analysis import TraceAnalysis
from hta.utils.utils import KernelType, get_kernel_type


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in spans)


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


# HTA 0.5 calls pandas APIs that pandas 3.1 deprecates; not ours to fix.
@pytest.mark.filterwarnings("ignore:The inplace keyword")
def test_hta_reads_the_predicted_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Integer durations and bytes-long all-reduces: every event starts and ends on a whole
    # microsecond, which is what HTA rounds to.
    trace = random_trace(seed=11, n_layers=6, integer=True)
    trace_path, schedule_path = tmp_path / "t.json", tmp_path / "s.json"
    out = tmp_path / "pace.json"
    save_trace(trace, trace_path)
    assert main(["compile", str(trace_path), "-o", str(schedule_path), "--json"]) == 0
    # One run per file: HTA reads a file as one rank.
    args = ["timeline", str(trace_path), "--schedule", str(schedule_path), "--baseline", ""]
    assert main([*args, "--format", "chrome", "-o", str(out), "--json"]) == 0
    capsys.readouterr()
    run = simulate(trace, load_schedule(schedule_path, trace=trace))

    doc = json.loads(out.read_text())
    assert doc["distributedInfo"]["rank"] == 0
    comm_events = [e for e in doc["traceEvents"] if e.get("cat") == "comm"]
    assert len(comm_events) == len(run.units)
    for e in comm_events:
        a = e["args"]
        assert e["name"].startswith("ncclDevKernel_AllReduce_Sum_u8_RING_LL(")
        assert a["Collective name"] == "allreduce"
        assert a["In msg nelems"] == a["Out msg nelems"] == a["bytes"]  # 1-byte elements
        assert a["dtype"] == "Byte"
        assert a["Group size"] == trace.comm.workers

    analysis = TraceAnalysis(trace_files={0: str(out)})
    df = analysis.t.get_trace(0)
    symbols = analysis.t.symbol_table.get_sym_table()
    kernels = df[df["stream"].ne(-1)]
    types = [get_kernel_type(symbols[i]) for i in kernels["name"]]
    assert types.count(KernelType.COMMUNICATION.name) == len(run.units)
    assert types.count(KernelType.COMPUTATION.name) == len(trace.ops)

    ops = _union(list(zip(run.op_start_us, run.op_finish_us, strict=True)))
    units = _union(list(zip(run.unit_start_us, run.unit_finish_us, strict=True)))
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    assert float(overlap["comp_comm_overlap_pctg"].iloc[0]) == pytest.approx(
        100 * _overlap(units, ops) / _length(units), abs=0.01
    )
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    assert float(breakdown["compute_time(us)"].iloc[0]) == pytest.approx(_length(ops))
    busy = _length(_union(ops + units))
    assert float(breakdown["idle_time(us)"].iloc[0]) == pytest.approx(
        max(run.op_finish_us + run.unit_finish_us) - min(run.op_start_us) - busy
    )
