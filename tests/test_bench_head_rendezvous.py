"""benchmarks/bench_head_rendezvous.py: its summary of two ranks' logged iterations, and its
bad input refused before any launch (the launch itself needs root's namespaces)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_head_rendezvous as bench  # noqa: E402


def _row(mode: str, start: float, forward_end: float, head_end: float, issue: float) -> Any:
    return {
        "mode": mode,
        "block": 0,
        "start": start,
        "forward_end": forward_end,
        "head_end": head_end,
        "issue": issue,
        "end": issue + 1.0,
    }


def test_summary_splits_each_iteration_by_the_rank_that_issued_last() -> None:
    # Iteration 1: rank 1 issues last; iteration 2: rank 0 does; a local row is left out.
    ranks = [
        [
            _row("early", 0.0, 0.100, 0.110, 0.111),
            _row("early", 2.0, 2.105, 2.130, 2.131),
            _row("local", 4.0, 4.1, 4.2, 4.2),
        ],
        [
            _row("early", 0.001, 0.102, 0.120, 0.125),
            _row("early", 2.0, 2.100, 2.112, 2.113),
            _row("local", 4.0, 4.1, 4.2, 4.2),
        ],
    ]
    got = bench.summary(ranks, "early")
    assert got["behind"] == pytest.approx([18.0, 25.0])
    assert got["ahead"] == pytest.approx([10.0, 12.0])
    assert got["skew"] == pytest.approx([14.0, 18.0])
    # From the later forward's end to the later issue.
    assert got["channel"] == pytest.approx([23.0, 26.0])
    assert got["it"] == pytest.approx([1125.0, 1131.0])
    assert bench.summary(ranks, "rendezvous")["it"] == []


@pytest.mark.parametrize("flag", ["--blocks", "--steps", "--first"])
def test_bad_counts_are_refused_before_any_launch(flag: str) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_head_rendezvous.py"), flag, "0"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert "must be >= 1" in out.stderr
    assert "Traceback" not in out.stderr
