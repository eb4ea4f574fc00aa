"""The compile pipeline (pace.compiler) and ``pace compile`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings

from pace.cli import main
from pace.compiler import compile_trace
from pace.errors import InputError, SolverError
from pace.io import load_schedule, save_trace
from pace.ir import Trace
from pace.synth import random_trace
from tests.strategies import traces

JSON_KEYS = {
    "predicted_iteration_us",
    "lower_bound_us",
    "baselines",
    "compile_seconds",
    "units",
    "fusion_groups",
}


def _trace() -> Trace:
    return random_trace(seed=11, n_layers=12, tensors_per_layer=(1, 4), alpha_us=30.0)


@given(trace=traces(max_layers=8))
@settings(max_examples=25)
def test_compile_is_between_bound_and_fifo(trace: Trace) -> None:
    res = compile_trace(trace)
    tol = 1e-9 * max(1.0, res.predicted_iteration_us)
    assert res.lower_bound_us <= res.predicted_iteration_us + tol
    assert res.predicted_iteration_us <= res.baselines["fifo"] + tol
    assert res.predicted_iteration_us == res.schedule.predicted_iteration_us
    assert res.gap >= -1e-9
    assert res.compile_seconds >= 0


def test_no_fusion_and_paper_and_search() -> None:
    trace = _trace()
    none = compile_trace(trace, fusion="none", baselines=False)
    paper = compile_trace(trace, fusion="paper", baselines=False)
    search = compile_trace(trace, baselines=False)
    assert all(len(g) == 1 for g in none.plan.groups)
    assert paper.plan.method == "paper"
    assert search.plan.method == "search"
    assert search.predicted_iteration_us <= none.predicted_iteration_us * (1 + 1e-9)
    assert search.predicted_iteration_us <= paper.predicted_iteration_us * (1 + 1e-9)
    assert search.baselines == {}


def test_lp_failure_falls_back_to_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    import pace.lp

    real = pace.lp.schedule

    def failing(trace: Trace, plan: object = None, *, solver: str = "exact", **kw: object):  # type: ignore[no-untyped-def]
        if solver == "lp":
            raise SolverError("highs said no")
        return real(trace, plan, solver=solver)  # type: ignore[arg-type]

    monkeypatch.setattr(pace.lp, "schedule", failing)
    res = compile_trace(_trace(), fusion="none", solver="lp", baselines=False)
    assert any("highs said no" in w and "exact" in w for w in res.warnings)


def test_lp_solver_path() -> None:
    trace = random_trace(seed=5, n_layers=4, integer=True)
    exact = compile_trace(trace, solver="exact", baselines=False)
    lp = compile_trace(trace, solver="lp", baselines=False)
    # Slot rounding may make the LP's own schedule slower; the pipeline then keeps the exact one.
    assert lp.predicted_iteration_us == pytest.approx(exact.predicted_iteration_us, rel=1e-6)
    assert lp.schedule.meta.get("solver") in {"lp", "exact"}


def test_bad_options() -> None:
    with pytest.raises(InputError, match="fusion"):
        compile_trace(_trace(), fusion="greedy")
    with pytest.raises(InputError, match="solver"):
        compile_trace(_trace(), solver="cplex")


def test_what_if_changes_the_cost_model() -> None:
    trace = _trace()
    slow = compile_trace(trace, bandwidth_gbps=1.0, baselines=False)
    assert slow.trace.comm.beta_us_per_byte > trace.comm.beta_us_per_byte
    assert slow.schedule.cost_model == slow.trace.comm


def test_cli_compile_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace()
    trace_path = tmp_path / "t.json"
    out_path = tmp_path / "s.json"
    save_trace(trace, trace_path)

    assert main(["compile", str(trace_path), "-o", str(out_path), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert set(obj) >= JSON_KEYS
    assert set(obj["baselines"]) >= {"fifo", "horovod", "ddp"}
    assert obj["units"] == len(load_schedule(out_path, trace=trace).units)
    grouped = [n for g in obj["fusion_groups"] for n in g["tensors"]]
    assert sorted(grouped) == sorted(t.name for t in trace.tensors)
    assert sum(g["bytes"] for g in obj["fusion_groups"]) == trace.total_bytes

    # The written file replays to exactly the predicted time.
    assert main(["simulate", str(trace_path), "--schedule", str(out_path), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["iteration_us"] == pytest.approx(obj["predicted_iteration_us"], rel=1e-9)

    # Human-readable form prints the plan, the bound, every baseline and the compile time.
    assert main(["compile", str(trace_path), "-o", str(out_path), "--fusion", "paper"]) == 0
    text = capsys.readouterr().out
    for word in ("fusion plan (paper)", "lower bound", "fifo", "horovod", "ddp", "compile:"):
        assert word in text

    assert main(["compile", str(trace_path), "-o", str(out_path), "--no-fusion", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert all(len(g["tensors"]) == 1 for g in obj["fusion_groups"])


def test_cli_compile_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.json"
    assert main(["compile", str(missing), "-o", str(tmp_path / "s.json")]) == 2
    assert "nope.json" in capsys.readouterr().err
    trace_path = tmp_path / "t.json"
    save_trace(_trace(), trace_path)
    code = main(
        [
            "compile",
            str(trace_path),
            "-o",
            str(tmp_path / "s.json"),
            "--no-fusion",
            "--fusion",
            "paper",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--no-fusion" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_compile_hedges_over_other_cost_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--hedge`` (repeatable) compiles under each model and ships the least-regret schedule;
    the file validates against the main trace, whose replay is its prediction. The trace of
    another job is refused on every path with one line naming the field."""
    import dataclasses

    from pace.ir import Interference

    base = random_trace(seed=102, n_layers=8, alpha_us=30.0)  # tests/test_hedge.py's trade

    def with_loss(us_per_byte: float) -> Trace:
        term = Interference(us_per_byte=us_per_byte, us_per_call=200.0, comm_stretch=0.05)
        return dataclasses.replace(base, comm=dataclasses.replace(base.comm, interference=term))

    paths = [tmp_path / f"{name}.json" for name in ("low", "high", "other")]
    for trace, path in zip((with_loss(5e-4), with_loss(1e-2), _trace()), paths, strict=True):
        save_trace(trace, path)
    out = tmp_path / "s.json"
    argv = ["compile", str(paths[0]), "-o", str(out), "--hedge", str(paths[1])]
    assert main([*argv, "--hedge", str(paths[1]), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["hedge"]["models"] == 3
    assert obj["hedge"]["chosen"] == 1  # the found trade of tests/test_hedge.py
    assert obj["predicted_iteration_us"] == obj["hedge"]["replays_us"][1][0]
    assert main(["validate", str(out), "--trace", str(paths[0])]) == 0
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)  # short names, so the table fits on one line
    assert main(["compile", "low.json", "-o", "s.json", "--hedge", "high.json"]) == 0
    text = capsys.readouterr().out
    assert "worst regret" in text
    assert "* high.json" in text
    assert main(["compile", str(paths[0]), "-o", str(out), "--hedge", str(paths[2])]) == 2
    err = capsys.readouterr().err
    assert "hedge" in err
    assert "only `comm` may differ" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_what_if_compile_replays_under_the_same_what_if(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace()
    trace_path = tmp_path / "t.json"
    out_path = tmp_path / "s.json"
    save_trace(trace, trace_path)
    args = ["--bandwidth-gbps", "1", "--workers", "4"]
    assert main(["compile", str(trace_path), "-o", str(out_path), "--json", *args]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["cost_model"]["workers"] == 4
    assert obj["cost_model"]["beta_us_per_byte"] > trace.comm.beta_us_per_byte
    assert main(["simulate", str(trace_path), "--schedule", str(out_path), "--json", *args]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["iteration_us"] == pytest.approx(obj["predicted_iteration_us"], rel=1e-9)
    # The schedule records the model it was compiled for; validate replays with it.
    assert main(["validate", str(out_path), "--trace", str(trace_path)]) == 0
