"""Contract check across stages: every schedule the scheduler produces passes
``pace validate SCHEDULE --trace TRACE`` (digest, coverage, and prediction == replay)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from hypothesis import given, settings

from pace.cli import main
from pace.io import save_schedule, save_trace
from pace.ir import FusionPlan, Trace
from pace.lp import schedule
from tests.strategies import traces


@settings(max_examples=15)
@given(trace=traces(max_layers=6))
def test_scheduler_output_validates(tmp_path_factory: pytest.TempPathFactory, trace: Trace) -> None:
    d: Path = tmp_path_factory.mktemp("vi")
    save_trace(trace, d / "t.json")
    sched = schedule(trace, FusionPlan.singletons(trace)).schedule
    save_schedule(sched, d / "s.json.gz")
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["validate", str(d / "s.json.gz"), "--trace", str(d / "t.json")])
    assert code == 0, err.getvalue()
    assert "valid schedule" in out.getvalue()
