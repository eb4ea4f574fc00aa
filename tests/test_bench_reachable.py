"""benchmarks/bench_reachable.py: the annealing search over every schedule the runtime can run.

Its steps keep a schedule whole (every byte of every tensor in exactly one unit, whole elements,
one element size per unit); its result is what the runtime's replay says of it, never slower
than where it started, and it finds the faster schedules a bad start leaves."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import bench_reachable as reach
from pace.compiler import compile_trace, framework_path_us
from pace.io import save_schedule, save_trace
from pace.ir import FrameworkPath, Schedule, Slice, Trace, Unit
from pace.sim import runtime_replay_us
from pace.synth import random_trace
from pace.verify import verify_schedule
from tests.strategies import typed_traces


def _covered(trace: Trace, state: reach.State) -> None:
    """Every tensor's bytes exactly once, in whole elements; one dtype per unit."""
    size = {t.name: t.size_bytes for t in trace.tensors}
    element = {t.name: t.element_bytes for t in trace.tensors}
    kind = {t.name: t.fusion_kind for t in trace.tensors}
    got: dict[str, list[tuple[int, int]]] = {n: [] for n in size}
    for unit in state:
        assert unit, "an empty unit"
        assert len({kind[n] for n, _, _ in unit}) == 1
        for n, lo, hi in unit:
            assert 0 <= lo < hi <= size[n]
            assert lo % element[n] == 0
            assert hi % element[n] == 0
            got[n].append((lo, hi))
    for n, ranges in got.items():
        ranges.sort()
        assert ranges[0][0] == 0, n
        assert ranges[-1][1] == size[n], n
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), n


def _one_unit(trace: Trace, compiled: Schedule) -> Schedule:
    """Every tensor in one unit: ready only at the backward's end, a bad start."""
    whole = tuple(
        Slice(tensor=t.name, offset_bytes=0, size_bytes=t.size_bytes) for t in trace.tensors
    )
    return dataclasses.replace(compiled, units=(Unit(priority=0.0, slices=whole),))


@settings(max_examples=30, deadline=None)
@given(
    trace=typed_traces(min_bytes=reach.MIN_CUT_BYTES),
    seed=st.integers(0, 2**16),
    n=st.integers(1, 60),
)
def test_steps_keep_a_schedule_whole(trace: Trace, seed: int, n: int) -> None:
    compiled = compile_trace(trace).schedule
    rng = random.Random(seed)
    kinds = {t.name: t.fusion_kind for t in trace.tensors}
    state = reach.state_of(compiled)
    for _ in range(n):
        state = reach.step(state, rng, kinds)
        _covered(trace, state)
    verify_schedule(reach.schedule_of(compiled, state), trace)


@settings(max_examples=15, deadline=None)
@given(trace=typed_traces(min_bytes=reach.MIN_CUT_BYTES), seed=st.integers(0, 2**16))
def test_the_result_is_its_replay_and_never_slower_than_the_start(trace: Trace, seed: int) -> None:
    compiled = compile_trace(trace).schedule
    got = reach.anneal(trace, compiled, steps=150, seed=seed)
    assert got.start_us == pytest.approx(runtime_replay_us(trace, compiled), rel=1e-12)
    assert got.iteration_us <= got.start_us
    assert got.schedule.in_order
    assert runtime_replay_us(trace, got.schedule) == pytest.approx(got.iteration_us, rel=1e-12)
    assert got.schedule.predicted_iteration_us == got.iteration_us
    verify_schedule(got.schedule, trace)
    _covered(trace, reach.state_of(got.schedule))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_it_finds_what_a_bad_start_leaves(seed: int) -> None:
    trace = random_trace(seed=seed, n_layers=8, alpha_us=200.0)
    compiled = compile_trace(trace)
    bad = _one_unit(trace, compiled.schedule)
    start_us = runtime_replay_us(trace, bad)
    assert compiled.predicted_iteration_us < 0.97 * start_us  # the start is bad
    got = reach.anneal(trace, bad, steps=1500, seed=0)
    # Half the way to the compiled schedule at least: a search that could not split units,
    # move pieces or reorder them would stay at the start.
    assert got.iteration_us < start_us - 0.5 * (start_us - compiled.predicted_iteration_us)


def test_the_table_from_a_kept_directory(tmp_path: Path, monkeypatch, capsys) -> None:
    trace = random_trace(seed=4, n_layers=6, alpha_us=200.0)
    compiled = compile_trace(trace)
    save_trace(trace, tmp_path / "1gbit-torch.trace.json.gz")
    save_schedule(compiled.schedule, tmp_path / "1gbit-torch.schedule.json")
    pace_ms = compiled.predicted_iteration_us / 1e3
    (tmp_path / "1gbit-torch.predicted.json").write_text(
        json.dumps({"predicted_ms": {"vanilla": 1.3 * pace_ms, "pace": pace_ms}})
    )
    argv = ["bench_reachable.py", str(tmp_path), "--steps", "200", "--seeds", "2", "--markdown"]
    monkeypatch.setattr(sys, "argv", argv)
    assert reach.main() == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "1gbit-torch" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[8] == "1.300x"  # vanilla / pace, as predicted
    assert float(cells[9].rstrip("x")) >= 1.3  # the best found is no slower
    assert cells[-1] == "within the model"


def test_a_schedule_on_the_frameworks_path_is_set_against_vanilla_through_the_path(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    base = random_trace(seed=5, n_layers=6, alpha_us=200.0)
    # A framework whose calls cost half the runtime's: its path replays faster than any units.
    path = FrameworkPath(
        backend="horovod",
        alpha_us=base.comm.alpha_us / 2,
        beta_us_per_byte=base.comm.beta_us_per_byte / 2,
    )
    trace = dataclasses.replace(base, comm=dataclasses.replace(base.comm, framework=path))
    schedule = dataclasses.replace(compile_trace(trace).schedule, framework="horovod")
    path_ms = framework_path_us(trace) / 1e3
    units_ms = runtime_replay_us(trace, schedule) / 1e3
    assert path_ms < units_ms
    save_trace(trace, tmp_path / "2gbit-horovod.trace.json.gz")
    save_schedule(schedule, tmp_path / "2gbit-horovod.schedule.json")
    (tmp_path / "2gbit-horovod.predicted.json").write_text(
        json.dumps({"predicted_ms": {"vanilla": path_ms, "pace": path_ms}})
    )
    argv = ["bench_reachable.py", str(tmp_path), "--steps", "50", "--seeds", "1", "--markdown"]
    monkeypatch.setattr(sys, "argv", argv)
    assert reach.main() == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "2gbit-horovod" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[8] == "1.000x (path)"
    # The units found are slower than the path: vanilla over them is below 1.
    best_ms = float(cells[3].split()[0])
    assert float(cells[9].rstrip("x")) == pytest.approx(path_ms / best_ms, abs=2e-3)
    assert cells[-1] == "beyond the model's best"
