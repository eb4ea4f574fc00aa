"""benchmarks/bench_hvd_calls.py end to end: two real Horovod launches (the runtime's settings
and Horovod's defaults), each rank's settings checked against the row that names them, and
every count timed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_hvd_calls_times_every_count_under_both_settings() -> None:
    pytest.importorskip("horovod.torch")
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_hvd_calls.py"),
            "--counts",
            "1,3",
            "--reps",
            "3",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for label in ("fusion and cache off", "Horovod's defaults"):
        # One row per count, and the line through them.
        assert out.stdout.count(label) == 3, out.stdout
    assert "each further call ms" in out.stdout


def _refused(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A benchmark run with bad arguments: argparse refuses them before any launch."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    ("counts", "said"), [("4", "two or more counts"), ("1,x", "whole numbers")]
)
def test_bench_hvd_calls_refuses_bad_counts(counts: str, said: str) -> None:
    out = _refused("bench_hvd_calls.py", "--counts", counts)
    assert out.returncode == 2
    assert said in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("flag", ["--launches", "--blocks"])
def test_bench_hvd_wait_refuses_no_launches_or_blocks(flag: str) -> None:
    """benchmarks/bench_hvd_wait.py needs root's namespaces to measure; its bad input is
    refused before it makes any."""
    out = _refused("bench_hvd_wait.py", flag, "0")
    assert out.returncode == 2
    assert "must be >= 1" in out.stderr
    assert "Traceback" not in out.stderr
