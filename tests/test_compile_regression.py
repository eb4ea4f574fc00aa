"""Refactorings of the compile pipeline keep every decision: the recorded cases compile to the
same predicted times, bounds, baseline replays and units (``benchmarks/compile_regression.py``;
re-record with ``--write`` only for an intended change of results, and say so in the commit)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import compile_regression as regression

ROOT = Path(__file__).resolve().parents[1]

RECORDED: dict[str, Any] = json.loads((ROOT / "tests/data/compile_regression.json").read_text())
CASES = {name: (trace, kw) for name, trace, kw in regression.cases(full=False)}


def test_every_case_is_recorded() -> None:
    assert sorted(CASES) == sorted(RECORDED)


@pytest.mark.parametrize("name", sorted(CASES))
def test_compile_reproduces_the_record(name: str) -> None:
    trace, kw = CASES[name]
    assert regression.differences(RECORDED[name], regression.record(trace, kw)) == []


def test_a_changed_result_is_reported() -> None:
    name = sorted(RECORDED)[0]
    want = dict(RECORDED[name])
    got = {**want, "predicted_iteration_us": want["predicted_iteration_us"] * (1 + 1e-6)}
    got["units_sha"] = "0" * 16
    diff = regression.differences(want, got)
    assert any(d.startswith("predicted_iteration_us") for d in diff)
    assert any(d.startswith("units_sha") for d in diff)
