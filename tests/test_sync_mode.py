"""Compiling for the runtime's synchronous mode (``pace compile --mode sync``).

In the sync loop ``backward()`` returns only once every gradient is reduced, so the next forward
waits for all of them: the simulator's barrier. ``sync_trace`` expresses that barrier in the
trace, so the whole pipeline optimises it; a schedule records its mode, and every replay of it
(``validate``, ``simulate``, ``compare``) runs on that loop.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings

from pace.cli import main
from pace.compiler import apply_what_if, compile_trace, sync_trace
from pace.errors import InputError
from pace.io import load_schedule, save_schedule, save_trace, schedule_from_dict, schedule_to_dict
from pace.ir import Trace
from pace.sim import POLICIES, SimOptions, schedule_policy, simulate
from pace.synth import random_trace
from tests.strategies import traces

BARRIER = SimOptions(barrier=True)


@settings(max_examples=40, deadline=None)
@given(traces())
def test_sync_trace_is_the_simulators_barrier(trace: Trace) -> None:
    synced = sync_trace(trace)
    for name in POLICIES:
        if name == "bytescheduler-tuned":
            continue  # a grid search: covered through its members
        assert simulate(synced, name).iteration_us == pytest.approx(
            simulate(trace, name, options=BARRIER).iteration_us, rel=1e-9, abs=1e-9
        ), name


@settings(max_examples=25, deadline=None)
@given(traces())
def test_sync_compile_replays_its_prediction_and_beats_every_baseline_in_that_loop(
    trace: Trace,
) -> None:
    result = compile_trace(trace, mode="sync", robust=False)
    sched = result.schedule
    assert sched.mode == "sync"
    # Replayed on the original trace under the barrier, the file's prediction holds.
    replay = simulate(trace, sched, options=BARRIER).iteration_us
    assert replay == pytest.approx(sched.predicted_iteration_us, rel=1e-9, abs=1e-6)
    for name, us in result.baselines.items():
        assert sched.predicted_iteration_us <= us * (1 + 1e-9), name
    # The sync loop can never be faster than the overlapped one at the optimum; the compiler's
    # fusion is a local search, so within OVERLAP_BAND (docs/fusion.md, "Known limits").
    overlap = compile_trace(trace, robust=False, baselines=False)
    assert overlap.predicted_iteration_us <= sched.predicted_iteration_us * (1 + OVERLAP_BAND)


OVERLAP_BAND = 1e-3
"""How much slower than the sync compile the overlapped one may replay: 0 of 1500 random traces
drawn like ``traces()`` do, and the one trace hypothesis found does by 0.057%
(``test_the_overlapped_compile_can_miss_the_sync_plan_by_a_little``)."""


def test_the_overlapped_compile_can_miss_the_sync_plan_by_a_little() -> None:
    """Found by hypothesis in CI: the sync compile fuses 12 gradients into 6 groups, which
    replays 12276.3 us in the overlapped loop too; the overlapped compile's search ends at no
    fusion, 12283.3 us. Its polish (merges and one-tensor shifts from the replayed candidates)
    stays there with a budget of 400 plans; the sync plan is 6 merges away. A documented limit
    of the local search, held to OVERLAP_BAND. The issue-order search (on by default) then
    holds back one unit and replays 12246.9 us, faster than the sync plan."""
    trace = random_trace(
        seed=1188762864, n_layers=7, tensors_per_layer=(0, 3), ops_per_layer=3, skip_prob=0.0
    )
    sync = compile_trace(trace, mode="sync", robust=False, baselines=False, order_search=False)
    overlap = compile_trace(trace, robust=False, baselines=False, order_search=False)
    in_overlap_us = simulate(trace, schedule_policy(sync.schedule)).iteration_us
    assert in_overlap_us == pytest.approx(sync.predicted_iteration_us, rel=1e-9)
    assert overlap.predicted_iteration_us > sync.predicted_iteration_us  # the limit, as found
    assert overlap.predicted_iteration_us <= sync.predicted_iteration_us * (1 + OVERLAP_BAND)
    searched = compile_trace(trace, robust=False, baselines=False)
    assert searched.predicted_iteration_us < sync.predicted_iteration_us


def test_mode_round_trips_and_old_files_mean_overlap(tmp_path: Path) -> None:
    trace = random_trace(seed=4, n_layers=5, alpha_us=30.0)
    sched = compile_trace(trace, mode="sync", baselines=False).schedule
    path = tmp_path / "s.json"
    save_schedule(sched, path)
    assert json.loads(path.read_text())["mode"] == "sync"
    assert load_schedule(path, trace=trace).mode == "sync"
    raw = schedule_to_dict(compile_trace(trace, baselines=False).schedule)
    assert "mode" not in raw  # overlap files look as they always did
    assert schedule_from_dict(raw).mode == "overlap"
    with pytest.raises(InputError, match="mode"):
        schedule_from_dict({**raw, "mode": "async"}, where="x.json")
    with pytest.raises(InputError, match="mode"):
        apply_what_if(trace, mode="async")  # type: ignore[arg-type]


def test_cli_compile_sync_validates_and_compare_shows_both_modes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = random_trace(seed=5, n_layers=6, alpha_us=30.0)
    trace_path = tmp_path / "t.json"
    save_trace(trace, trace_path)
    over, sync = tmp_path / "o.json", tmp_path / "s.json"
    assert main(["compile", str(trace_path), "-o", str(over), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "overlap"
    assert main(["compile", str(trace_path), "-o", str(sync), "--mode", "sync", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "sync"
    assert main(["validate", str(sync), "--trace", str(trace_path)]) == 0
    capsys.readouterr()
    args = ["compare", str(trace_path), "--schedule", str(over), "--schedule", str(sync)]
    assert main([*args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["baselines"]
    assert rows["schedule (sync)"] == pytest.approx(out["predicted_iteration_us"])
    assert rows["schedule"] <= rows["schedule (sync)"]
    assert main(["simulate", str(trace_path), "--schedule", str(sync), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["matches_prediction"] is True
