"""The simulation sweep (benchmarks/bench_sweep.py): structure and invariants on tiny grids."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks._common import BASELINES, SHARED_CHANNEL, compute_only_us, load_shipped
from benchmarks.bench_sweep import (
    CALIBRATED,
    CALIBRATION,
    REPORTED,
    Point,
    calibrated_speedup,
    gpu_target_us,
    make_tasks,
    paper_rows,
    plot,
    run_sweep,
    speedup_rows,
    summary_rows,
    time_rows,
    violations,
    with_latency,
)
from pace.compiler import apply_what_if
from pace.ir import Trace
from pace.synth import random_trace

BANDWIDTHS = (1.0, 10.0)
WORKERS = (2, 16)


@pytest.fixture(scope="module")
def traces() -> dict[str, Trace]:
    # Many small tensors, a per-call latency and a comm-heavy ratio: fusion, order and
    # preemption all matter, so pace and the baselines differ.
    return {
        "synth": random_trace(seed=7, n_layers=8, alpha_us=30.0),
        "synth2": random_trace(seed=11, n_layers=5, alpha_us=50.0),
    }


@pytest.fixture(scope="module")
def points(traces: dict[str, Trace]) -> list[Point]:
    tasks = make_tasks(traces, scales=["2"], bandwidths_gbps=BANDWIDTHS, workers=WORKERS)
    return run_sweep(traces, tasks, jobs=1)


def test_grid_is_complete_and_in_task_order(points: list[Point]) -> None:
    got = [(p.task.trace, p.task.bandwidth_gbps, p.task.workers) for p in points]
    want = [(t, b, w) for t in ("synth", "synth2") for b in BANDWIDTHS for w in WORKERS]
    assert got == want
    for p in points:
        assert p.task.compute_speedup == 2.0
        assert set(REPORTED) <= set(p.baselines_us)
        assert set(BASELINES) < set(REPORTED)


def test_pace_within_its_guarantee_and_above_the_bound(points: list[Point]) -> None:
    for p in points:
        one_channel = [us for b, us in p.baselines_us.items() if b not in SHARED_CHANNEL]
        assert p.pace_us <= min(one_channel) * (1 + 1e-9), (p.task, p.baselines_us)
        assert p.pace_us <= min(p.baselines_us[b] for b in SHARED_CHANNEL) * 1.05
        assert p.bound_us <= p.pace_us * (1 + 1e-9)
        assert p.gap >= -1e-9
    assert violations(points) == []


def test_speedups_are_baseline_over_pace(points: list[Point]) -> None:
    for p in points:
        for b in REPORTED:
            assert p.speedup(b) == pytest.approx(p.baselines_us[b] / p.pace_us)
        assert p.baselines_us[p.best_baseline] == min(p.baselines_us[b] for b in REPORTED)
    # Not a grid of ties: on these comm-heavy traces pace beats WFBP/FIFO somewhere by > 1%.
    assert max(p.speedup("fifo") for p in points) > 1.01


def test_each_point_uses_its_own_cost_model(traces: dict[str, Trace], points: list[Point]) -> None:
    for name, trace in traces.items():
        # The compute scale is applied: the compute-only path is the trace's, halved.
        expect = compute_only_us(apply_what_if(trace, compute_speedup=2.0))
        mine = {(p.task.bandwidth_gbps, p.task.workers): p for p in points if p.task.trace == name}
        for p in mine.values():
            assert p.compute_us == pytest.approx(expect)
        for w in WORKERS:
            # Less bandwidth can only cost more: the bound is monotone, and the two differ.
            slow, fast = mine[(1.0, w)], mine[(10.0, w)]
            assert slow.bound_us >= fast.bound_us
            assert slow.pace_us > fast.pace_us


def test_process_pool_gives_the_same_points(traces: dict[str, Trace], points: list[Point]) -> None:
    tasks = make_tasks(traces, scales=["2"], bandwidths_gbps=BANDWIDTHS, workers=WORKERS)
    done: list[Point] = []
    pooled = run_sweep(traces, tasks, jobs=2, on_done=done.append)
    assert len(done) == len(tasks)
    assert [(p.task, p.pace_us, p.bound_us, dict(p.baselines_us)) for p in pooled] == [
        (p.task, p.pace_us, p.bound_us, dict(p.baselines_us)) for p in points
    ]


def test_tables_are_rectangular(points: list[Point]) -> None:
    for cols, rows in (
        time_rows(points),
        speedup_rows(points),
        summary_rows(points),
        paper_rows(points),
    ):
        assert rows
        assert all(len(r) == len(cols) for r in rows)
    _, summary = summary_rows(points)
    assert [r[0] for r in summary] == ["synth", "synth2"]


def test_calibration_hits_the_gpu_target() -> None:
    # ResNet-50 is the anchor: 32 images at 209 images/s on the paper's GPU.
    assert gpu_target_us("resnet50") == pytest.approx(32 / 209 * 1e6)
    trace = load_shipped("lstm_seq2seq")
    x = calibrated_speedup("lstm_seq2seq", trace)
    scaled = apply_what_if(trace, compute_speedup=x)
    assert compute_only_us(scaled) == pytest.approx(gpu_target_us("lstm_seq2seq"))
    tasks = make_tasks(
        {"lstm_seq2seq": trace}, scales=[CALIBRATED], bandwidths_gbps=[10.0], workers=[8]
    )
    assert [t.compute_speedup for t in tasks] == [x]
    assert set(CALIBRATION) == {"vgg16", "resnet50", "transformer", "lstm_seq2seq"}
    with pytest.raises(KeyError):
        make_tasks({"synth": trace}, scales=[CALIBRATED], bandwidths_gbps=[10.0], workers=[8])


def test_plot_writes_both_figures(points: list[Point], tmp_path: Path) -> None:
    written = plot(points, tmp_path)
    assert sorted(p.name for p in written) == ["sweep_bandwidth_x2.png", "sweep_workers_x2.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert math.isfinite(points[0].gap)


def test_latency_option_changes_only_alpha(traces: dict[str, Trace]) -> None:
    trace = traces["synth"]
    slow = with_latency(trace, trace.comm.alpha_us + 500.0)
    assert slow.comm.alpha_us == trace.comm.alpha_us + 500.0
    assert slow.comm.beta_us_per_byte == trace.comm.beta_us_per_byte
    assert slow.ops == trace.ops
    tasks = make_tasks({"synth": trace}, scales=["2"], bandwidths_gbps=[10.0], workers=[8])
    base, more = (run_sweep({"synth": t}, tasks)[0] for t in (trace, slow))
    # FIFO sends the same tensors in the same order; each call now costs 500 us more.
    assert more.baselines_us["fifo"] > base.baselines_us["fifo"]
