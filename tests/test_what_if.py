"""The compute what-if (``--compute-speedup``): a CPU profile replayed as a faster device."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pace.cli import main
from pace.compiler import apply_what_if, compile_trace
from pace.errors import InputError
from pace.io import save_trace, trace_digest
from pace.sim import schedule_policy, simulate
from pace.synth import random_trace


def test_speedup_divides_every_op_duration_and_keeps_the_rest() -> None:
    trace = random_trace(seed=3, n_layers=6)
    fast = apply_what_if(trace, compute_speedup=4.0)
    assert [op.duration_us * 4.0 for op in fast.ops] == pytest.approx(
        [op.duration_us for op in trace.ops]
    )
    assert fast.tensors == trace.tensors
    assert fast.comm == trace.comm


@pytest.mark.parametrize("bad", [0.0, -2.0, float("nan"), float("inf")])
def test_bad_speedup_is_an_input_error(bad: float) -> None:
    with pytest.raises(InputError, match="--compute-speedup"):
        apply_what_if(random_trace(seed=1, n_layers=2), compute_speedup=bad)


def test_compiled_schedule_matches_the_original_trace_and_replays_scaled() -> None:
    trace = random_trace(seed=5, n_layers=12, alpha_us=20.0)
    result = compile_trace(trace, compute_speedup=20.0, baselines=False)
    sched = result.schedule
    assert sched.trace_digest == trace_digest(trace)
    assert sched.compute_speedup == 20.0
    scaled = apply_what_if(trace, compute_speedup=20.0)
    replay = simulate(dataclasses.replace(scaled, comm=sched.cost_model), schedule_policy(sched))
    assert replay.iteration_us == pytest.approx(sched.predicted_iteration_us, rel=1e-9)
    # Faster compute leaves less to hide behind: the iteration shrinks, but not 20x.
    unscaled = compile_trace(trace, baselines=False).predicted_iteration_us
    assert unscaled / 20.0 < result.predicted_iteration_us < unscaled


def test_cli_compile_then_validate_with_speedup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace_path = tmp_path / "t.json"
    sched_path = tmp_path / "s.json"
    save_trace(random_trace(seed=8, n_layers=8, alpha_us=30.0), trace_path)
    args = ["compile", str(trace_path), "-o", str(sched_path), "--compute-speedup", "50"]
    assert main(args) == 0
    assert main(["validate", str(sched_path), "--trace", str(trace_path)]) == 0
    assert main(["compare", str(trace_path), "--compute-speedup", "50", "--json"]) == 0
    capsys.readouterr()
    # The schedule matches the trace as profiled; its recorded speedup applies when none is given.
    assert main(["simulate", str(trace_path), "--schedule", str(sched_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["matches_prediction"] is True
    assert main(["compare", str(trace_path), "--schedule", str(sched_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["baselines"]["schedule"] <= out["baselines"]["fifo"]
    # A schedule compiled for another cluster replays on the cost model it records.
    wide = tmp_path / "wide.json"
    assert main(["compile", str(trace_path), "-o", str(wide), "--bandwidth-gbps", "1"]) == 0
    capsys.readouterr()
    assert main(["simulate", str(trace_path), "--schedule", str(wide), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["matches_prediction"] is True
    assert main([*args[:4], "--compute-speedup", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "--compute-speedup" in err[0]
