"""``pace.timeline`` and ``pace timeline``: the Chrome trace and the PNG show exactly the
simulator's replay, and bad input exits 2 with one line naming the file or option.
"""

from __future__ import annotations

import doctest
import itertools
import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pace.timeline
from pace.cli import main
from pace.compiler import compile_trace
from pace.io import load_schedule, load_trace, save_schedule, save_trace
from pace.ir import Trace
from pace.sim import SimOptions, SimResult, simulate
from pace.synth import random_trace
from pace.timeline import build_timeline, figure, render_png, to_chrome

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"
TINY = DATA / "tiny.trace.json"
TINY_SCHEDULE = DATA / "tiny.schedule.json"
VGG16 = REPO / "traces" / "vgg16.json.gz"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_doctests() -> None:
    result = doctest.testmod(pace.timeline)
    assert result.attempted > 0
    assert result.failed == 0


@pytest.fixture(scope="module")
def compiled() -> tuple[Trace, dict[str, SimResult]]:
    """A synthetic trace with FIFO and its compiled schedule replayed (fusion: some units carry
    several tensors, some tensors are split)."""
    trace = random_trace(seed=7, n_layers=8, alpha_us=20.0)
    result = compile_trace(trace, baselines=False)
    runs = {"FIFO": simulate(trace, "fifo"), "pace": simulate(trace, result.schedule)}
    return trace, runs


def _round_trip(obj: dict[str, Any]) -> dict[str, Any]:
    # Strict JSON (no NaN): what Perfetto and chrome://tracing parse.
    loaded: dict[str, Any] = json.loads(json.dumps(obj, allow_nan=False))
    return loaded


def check_chrome(chrome: dict[str, Any], trace: Trace, runs: dict[str, SimResult]) -> None:
    """Every op and unit of every run, at the simulator's times, on named, non-overlapping lanes."""
    assert chrome["displayTimeUnit"] == "ms"
    events = chrome["traceEvents"]
    process_names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    thread_names = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    assert all(e["ph"] == "M" for e in events if e["name"] in ("process_name", "thread_name"))
    assert sorted(process_names) == list(range(1, len(runs) + 1))
    op_index = {op.name: i for i, op in enumerate(trace.ops)}
    for pid, (label, res) in enumerate(runs.items(), start=1):
        assert process_names[pid].startswith(label)
        assert f"{res.iteration_us / 1e3:.3f} ms" in process_names[pid]
        mine = [e for e in events if e["pid"] == pid and e["ph"] == "X"]
        ops = [e for e in mine if e["cat"] != "comm"]
        comm = [e for e in mine if e["cat"] == "comm"]
        # One event per op, one per unit.
        assert sorted(e["args"]["op"] for e in ops) == sorted(op_index)
        assert sorted(e["args"]["unit"] for e in comm) == list(range(len(res.units)))
        for e in ops:
            i = op_index[e["args"]["op"]]
            assert e["name"] == trace.ops[i].name
            assert e["cat"] == trace.ops[i].phase
            assert e["ts"] == pytest.approx(res.op_start_us[i])
            assert e["dur"] == pytest.approx(res.op_finish_us[i] - res.op_start_us[i])
        for e in comm:
            k = e["args"]["unit"]
            unit = res.units[k]
            assert e["ts"] == pytest.approx(res.unit_start_us[k])
            assert e["dur"] == pytest.approx(res.unit_finish_us[k] - res.unit_start_us[k])
            assert e["args"]["bytes"] == unit.size_bytes
            assert e["args"]["priority"] == unit.priority
            assert e["args"]["tensors"] == list(unit.tensors)
        lanes: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for e in mine:
            assert (pid, e["tid"]) in thread_names
            assert e["dur"] >= 0
            assert e["ts"] >= 0
            assert e["ts"] + e["dur"] <= res.iteration_us * (1 + 1e-9)
            lanes[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
        # Ops and units never share a lane, and a lane's events never overlap (X events must nest).
        comm_tids = {e["tid"] for e in comm}
        assert comm_tids.isdisjoint(e["tid"] for e in ops)
        assert {thread_names[pid, t] for t in comm_tids} <= {
            "comm",
            *(f"comm {i}" for i in range(1, 99)),
        }
        for spans in lanes.values():
            spans.sort()
            for (_, f1), (s2, _) in itertools.pairwise(spans):
                assert s2 >= f1 - 1e-6
        ends = [e for e in events if e["pid"] == pid and e["ph"] == "i"]
        assert len(ends) == 1
        assert ends[0]["ts"] == pytest.approx(res.iteration_us)
        assert ends[0]["s"] == "p"


def test_chrome_trace_matches_the_simulator(compiled: tuple[Trace, dict[str, SimResult]]) -> None:
    trace, runs = compiled
    # The compiled schedule really reorders / fuses, or this test would show little.
    assert (
        len(runs["pace"].units) != len(trace.tensors)
        or runs["pace"].iteration_us < runs["FIFO"].iteration_us
    )
    check_chrome(_round_trip(to_chrome(build_timeline(trace, runs))), trace, runs)


@given(
    seed=st.integers(0, 10_000),
    credit=st.integers(1, 4),
    policy=st.sampled_from(["fifo", "bytescheduler", "p3"]),
)
def test_lanes_are_as_few_as_the_overlap_allows(seed: int, credit: int, policy: str) -> None:
    trace = random_trace(seed=seed, n_layers=5, alpha_us=5.0)
    res = simulate(trace, policy, options=SimOptions(credit=credit))
    tl = build_timeline(trace, {policy: res})
    run = tl.runs[0]
    check_chrome(_round_trip(to_chrome(tl)), trace, {policy: res})
    # Greedy interval partitioning is optimal: as many lanes as intervals overlap at one time
    # (touching intervals do not overlap).
    for kind, starts, finishes, lanes in (
        ("compute", res.op_start_us, res.op_finish_us, run.compute_lanes),
        ("comm", res.unit_start_us, res.unit_finish_us, run.comm_lanes),
    ):
        points = sorted(
            [(f, -1) for s, f in zip(starts, finishes, strict=True) if f > s]
            + [(s, +1) for s, f in zip(starts, finishes, strict=True) if f > s]
        )
        depth = peak = 0
        for _, step in points:
            depth += step
            peak = max(peak, depth)
        assert lanes == max(peak, 1), kind
    assert run.comm_lanes <= credit


def test_comm_depth_follows_the_forward_order() -> None:
    trace = load_trace(TINY)
    run = build_timeline(trace, {"fifo": simulate(trace, "fifo")}).runs[0]
    depth = {b.name: b.depth for b in run.bars if b.kind == "comm"}
    # layer1.weight feeds the first forward op: depth 0; layer2.weight the last: depth 1.
    assert depth == {"layer1.weight": 0.0, "layer2.weight": 1.0}
    assert all(b.depth is None for b in run.bars if b.kind == "compute")


def test_build_timeline_refuses_foreign_or_no_runs() -> None:
    tiny = load_trace(TINY)
    other = random_trace(seed=1, n_layers=3)
    with pytest.raises(ValueError, match="not replayed on trace"):
        build_timeline(tiny, {"x": simulate(other, "fifo")})
    with pytest.raises(ValueError, match="at least one run"):
        build_timeline(tiny, {})


def test_png_has_one_panel_per_run(
    compiled: tuple[Trace, dict[str, SimResult]], tmp_path: Path
) -> None:
    import matplotlib.image

    trace, runs = compiled
    tl = build_timeline(trace, runs)
    fig = figure(tl)
    panels = [ax for ax in fig.axes if ax.get_title(loc="left")]
    assert len(panels) == 2
    for ax, (label, res) in zip(panels, runs.items(), strict=True):
        title = ax.get_title(loc="left")
        assert title.startswith(label)
        shown = f"{res.iteration_us / 1e3:.4g} ms" if tl.span_us >= 10_000 else None
        shown = shown or f"{res.iteration_us:.4g} us"
        assert shown in title
    # A shared time axis: the panels show the same range.
    assert panels[0].get_xlim() == panels[1].get_xlim()
    path = tmp_path / "t.png"
    render_png(tl, path)
    assert path.read_bytes()[:8] == PNG_MAGIC
    image = matplotlib.image.imread(str(path))
    height, width = image.shape[:2]
    assert width > height > 100


def test_png_needs_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes the import fail, as if matplotlib were not installed.
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    trace = load_trace(TINY)
    tl = build_timeline(trace, {"fifo": simulate(trace, "fifo")})
    with pytest.raises(ImportError, match=r"pace\[plot\]"):
        render_png(tl, tmp_path / "t.png")


# ---------------------------------------------------------------------------------------------
# CLI


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main([*args, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    if isinstance(out.get("runs"), list):
        # Panel order is list order; index by label for the checks.
        assert len({r["label"] for r in out["runs"]}) == len(out["runs"])
        out["runs"] = {r["label"]: r for r in out["runs"]}
    return out


def test_cli_tiny_chrome_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "t.json"
    got = run_cli(
        ["timeline", str(TINY), "--schedule", str(TINY_SCHEDULE), "-o", str(out_json)], capsys
    )
    # The worked example: FIFO 44 us, the shipped schedule 39 us.
    assert got["format"] == "chrome"
    assert {k: v["iteration_us"] for k, v in got["runs"].items()} == {"fifo": 44.0, "pace": 39.0}
    trace = load_trace(TINY)
    schedule = load_schedule(TINY_SCHEDULE, trace=trace)
    runs = {"fifo": simulate(trace, "fifo"), "pace": simulate(trace, schedule)}
    check_chrome(json.loads(out_json.read_text()), trace, runs)

    out_png = tmp_path / "t.png"
    got = run_cli(
        ["timeline", str(TINY), "--schedule", str(TINY_SCHEDULE), "-o", str(out_png)], capsys
    )
    assert got["format"] == "png"
    assert out_png.read_bytes()[:8] == PNG_MAGIC
    # --format wins over the suffix.
    odd = tmp_path / "t.out"
    got = run_cli(["timeline", str(TINY), "--format", "chrome", "-o", str(odd)], capsys)
    assert got["format"] == "chrome"
    assert list(got["runs"]) == ["fifo"]
    assert json.loads(odd.read_text())["traceEvents"]


def test_cli_shipped_trace_matches_simulate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shipped trace, compiled for a what-if cluster; the timeline's times are the ones
    ``pace simulate`` prints for the same flags."""
    schedule = tmp_path / "vgg16.schedule.json"
    what_if = ["--compute-speedup", "30", "--bandwidth-gbps", "10", "--workers", "8"]
    assert main(["compile", str(VGG16), "-o", str(schedule), *what_if, "--json"]) == 0
    capsys.readouterr()
    out = tmp_path / "vgg16.json"
    got = run_cli(
        [
            "timeline",
            str(VGG16),
            "--schedule",
            str(schedule),
            "--baseline",
            "fifo,bytescheduler",
            "-o",
            str(out),
            *what_if,
        ],
        capsys,
    )
    assert list(got["runs"]) == ["fifo", "bytescheduler", "pace"]
    for label, policy_args in (
        ("fifo", ["--policy", "fifo"]),
        ("bytescheduler", ["--policy", "bytescheduler"]),
        ("pace", ["--schedule", str(schedule)]),
    ):
        sim = run_cli(["simulate", str(VGG16), *policy_args, *what_if], capsys)
        assert got["runs"][label]["iteration_us"] == sim["iteration_us"], label
    assert got["runs"]["pace"]["iteration_us"] < got["runs"]["fifo"]["iteration_us"]
    chrome = json.loads(out.read_text())
    n_ops = len(load_trace(VGG16).ops)
    for pid, label in enumerate(got["runs"], start=1):
        x = [e for e in chrome["traceEvents"] if e["pid"] == pid and e["ph"] == "X"]
        assert len(x) == n_ops + got["runs"][label]["units"]
    png = tmp_path / "vgg16.png"
    assert main(["timeline", str(VGG16), "--schedule", str(schedule), "-o", str(png)]) == 0
    assert "1.1" in capsys.readouterr().out  # the speed-up column of the table
    assert png.read_bytes()[:8] == PNG_MAGIC


# args (TRACE etc. filled in by bad_args) -> text the one stderr line must start with.
BAD: dict[str, tuple[list[str], str]] = {
    "missing trace": (["{missing}", "-o", "{out}"], "pace: {missing}: "),
    "schedule of another trace": (
        ["{vgg}", "--schedule", "{tiny_schedule}", "-o", "{out}"],
        "pace: {tiny_schedule}: trace_digest: schedule was compiled for trace",
    ),
    "missing schedule": (
        ["{tiny}", "--schedule", "{missing}", "-o", "{out}"],
        "pace: {missing}: ",
    ),
    "unknown baseline": (
        ["{tiny}", "--baseline", "fifo,nope", "-o", "{out}"],
        "pace: --baseline: unknown policy 'nope'",
    ),
    "nothing to show": (["{tiny}", "--baseline", "", "-o", "{out}"], "pace: --baseline: nothing"),
    "bad format": (
        ["{tiny}", "--format", "svg", "-o", "{out}"],
        "pace: error: argument --format: invalid choice: 'svg'",
    ),
    "no output": (["{tiny}"], "pace: error: the following arguments are required: -o/--output"),
    "unwritable output": (["{tiny}", "-o", "{missing_dir}/t.png"], "pace: {missing_dir}/t.png: "),
    "bad credit": (["{tiny}", "--credit", "0", "-o", "{out}"], "pace: --credit: "),
    "bad speedup": (
        ["{tiny}", "--compute-speedup", "-1", "-o", "{out}"],
        "pace: --compute-speedup: ",
    ),
}


def bad_args(case: str, tmp_path: Path) -> tuple[list[str], str]:
    names = {
        "missing": str(tmp_path / "missing.json"),
        "missing_dir": str(tmp_path / "no_such_dir"),
        "out": str(tmp_path / "t.png"),
        "tiny": str(TINY),
        "tiny_schedule": str(TINY_SCHEDULE),
        "vgg": str(VGG16),
    }
    args, prefix = BAD[case]
    return ["timeline", *(a.format(**names) for a in args)], prefix.format(**names)


@pytest.mark.parametrize("case", sorted(BAD))
def test_cli_bad_input_exits_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, prefix = bad_args(case, tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors exit from inside parse_args
        code = int(exc.code or 0)
    assert code == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert "Traceback" not in out.err
    assert out.err.count("\n") == 1, out.err
    assert out.err.startswith(prefix), out.err
    assert not (tmp_path / "t.png").exists()


def test_cli_missing_matplotlib_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    assert main(["timeline", str(TINY), "-o", str(tmp_path / "t.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pace: --format: PNG timelines need matplotlib: pip install 'pace[plot]'")
    assert err.count("\n") == 1
    # The Chrome trace needs no matplotlib.
    assert main(["timeline", str(TINY), "-o", str(tmp_path / "t.json")]) == 0


def test_real_cli_mismatch_one_line(tmp_path: Path) -> None:
    # The real entry point in a fresh interpreter, as a user sees it.
    argv, prefix = bad_args("schedule of another trace", tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pace", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(prefix)


def test_saved_synthetic_schedule_round_trip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A schedule compiled in process, saved, and drawn from the files: same times as in process."""
    trace = random_trace(seed=3, n_layers=6, alpha_us=10.0)
    result = compile_trace(trace, baselines=False)
    trace_path, schedule_path = tmp_path / "t.json", tmp_path / "s.json"
    save_trace(trace, trace_path)
    save_schedule(result.schedule, schedule_path)
    got = run_cli(
        [
            "timeline",
            str(trace_path),
            "--schedule",
            str(schedule_path),
            "-o",
            str(tmp_path / "o.json"),
        ],
        capsys,
    )
    assert math.isclose(got["runs"]["pace"]["iteration_us"], result.predicted_iteration_us)
