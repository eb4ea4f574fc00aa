"""`pace recompile`: the offline drift path, end to end through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pace.cli import main
from pace.drift.estimate import ObservedStats
from pace.io import load_schedule, load_trace, trace_digest

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "data" / "tiny.trace.json"
SCHEDULE = ROOT / "tests" / "data" / "tiny.schedule.json"
STATS = ROOT / "docs" / "examples" / "drift-stats.json"


def test_recompile_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "new.schedule.json"
    est_trace = tmp_path / "est.trace.json"
    rc = main(
        [
            "recompile",
            str(TRACE),
            "--observed",
            str(STATS),
            "-o",
            str(out),
            "--schedule",
            str(SCHEDULE),
            "--trace-out",
            str(est_trace),
            "--json",
        ]
    )
    assert rc == 0
    obj = json.loads(capsys.readouterr().out)
    # The link runs at half speed in the example: beta 1 -> 2 us/byte, alpha stays 0.
    assert obj["estimate"]["beta_us_per_byte"] == pytest.approx(2.0, rel=0.02)
    assert obj["estimate"]["alpha_us"] == pytest.approx(0.0, abs=0.5)
    assert obj["estimate"]["iterations_used"] == 3
    new_trace = load_trace(est_trace)
    sched = load_schedule(out, trace=new_trace)  # verified against the re-estimated trace
    assert sched.trace_digest == trace_digest(new_trace)
    assert obj["predicted_iteration_us"] == pytest.approx(sched.predicted_iteration_us)
    # Hand-computed: layer2 (40 us) from 10 is preempted at 20 by layer1 (8 us), fw.layer1
    # 28-33, layer2 finishes at 58, fw.layer2 58-63.
    assert obj["predicted_iteration_us"] == pytest.approx(63.0, rel=0.02)
    assert obj["current_us"] == pytest.approx(63.0, rel=0.02)
    assert obj["switch"] is False
    for key in ("compile_seconds", "units", "gain", "schedule"):
        assert key in obj


def test_recompile_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["recompile", str(TRACE), "--observed", str(STATS), "-o", str(tmp_path / "s.json")])
    assert rc == 0
    assert "predicted_iteration_us (new)" in capsys.readouterr().out


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def test_bad_stats_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    obj = json.loads(STATS.read_text())
    obj["iterations"][1]["units"] = [[4, -1.0]]
    bad.write_text(json.dumps(obj))
    rc = main(["recompile", str(TRACE), "--observed", str(bad), "-o", str(tmp_path / "o.json")])
    assert rc == 2
    err = _one_line_error(capsys)
    assert "bad.json" in err
    assert "iterations[1].units[0]" in err
    assert not (tmp_path / "o.json").exists()


def test_stats_of_another_trace_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stats = ObservedStats.load(STATS)
    other = tmp_path / "other.json"
    ObservedStats(iterations=stats.iterations, trace_digest="0" * 64).dump(other)
    rc = main(["recompile", str(TRACE), "--observed", str(other), "-o", str(tmp_path / "o.json")])
    assert rc == 2
    err = _one_line_error(capsys)
    assert "other.json" in err
    assert "trace_digest" in err


def test_bad_window_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "recompile",
            str(TRACE),
            "--observed",
            str(STATS),
            "-o",
            str(tmp_path / "o.json"),
            "--window",
            "0",
        ]
    )
    assert rc == 2
    assert "--window" in _one_line_error(capsys)


def test_recompile_with_a_term_warns_without_the_running_schedule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With an interference term the estimate needs the schedule that ran: without
    --schedule one warning line; with it none."""
    import dataclasses

    from pace.compiler import compile_trace
    from pace.io import load_trace, save_schedule, save_trace
    from pace.ir import Interference

    base = load_trace(TRACE)
    term = Interference(us_per_byte=1e-3, comm_stretch=0.1)
    trace = dataclasses.replace(base, comm=dataclasses.replace(base.comm, interference=term))
    save_trace(trace, tmp_path / "t.json")
    save_schedule(compile_trace(trace, baselines=False).schedule, tmp_path / "cur.json")
    argv = ["recompile", str(tmp_path / "t.json"), "--observed", str(STATS)]
    argv += ["-o", str(tmp_path / "new.json"), "--json"]
    assert main(argv) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("pace: warning:")
    assert "no --schedule" in err[0]
    assert main([*argv, "--schedule", str(tmp_path / "cur.json")]) == 0
    assert capsys.readouterr().err == ""
