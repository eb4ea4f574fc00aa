"""The framework's own path: the trace's measured ``comm.framework``, the compiler's choice
between it and the compiled units (``framework_path_us``), the schedule's ``framework`` field
and ``pace compile``'s report of both."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.cli import main
from pace.compiler import FRAMEWORK_MARGIN, compile_trace, framework_path_us
from pace.errors import InputError
from pace.io import (
    load_schedule,
    save_schedule,
    save_trace,
    schedule_from_dict,
    schedule_to_dict,
    trace_from_dict,
    trace_to_dict,
)
from pace.ir import FrameworkPath, Interference, Trace
from pace.sim import compare, simulate
from pace.synth import random_trace
from tests.strategies import traces


def _with_path(trace: Trace, scale: float, term: Interference | None = None) -> Trace:
    """``trace`` with a measured framework path whose calls cost ``scale`` times the trace's."""
    path = FrameworkPath(
        backend="horovod",
        alpha_us=trace.comm.alpha_us * scale,
        beta_us_per_byte=trace.comm.beta_us_per_byte * scale,
        interference=term,
    )
    return dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, framework=path))


# --- the files ----------------------------------------------------------------------------


def test_trace_round_trips_the_framework_path_and_old_files_keep_loading() -> None:
    trace = _with_path(random_trace(seed=1, n_layers=3), 0.5, Interference(us_per_call=3.0))
    obj = trace_to_dict(trace)
    assert obj["comm"]["framework"]["version"] == 1
    assert trace_from_dict(obj).comm == trace.comm
    del obj["comm"]["framework"]
    assert trace_from_dict(obj).comm.framework is None


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("backend", "mpi", "comm.framework.backend"),
        ("version", 2, "comm.framework.version"),
        ("alpha_us", -1, "comm.framework.alpha_us"),
        ("beta_us_per_byte", "fast", "comm.framework.beta_us_per_byte"),
    ],
)
def test_a_bad_framework_path_names_its_field(key: str, value: object, field: str) -> None:
    obj = trace_to_dict(_with_path(random_trace(seed=1, n_layers=3), 0.5))
    obj["comm"]["framework"][key] = value
    with pytest.raises(InputError) as err:
        trace_from_dict(obj, where="t.json")
    assert err.value.field == field


def test_schedule_round_trips_the_choice_and_refuses_an_unknown_framework() -> None:
    res = compile_trace(_with_path(random_trace(seed=2, n_layers=6, alpha_us=300.0), 0.2))
    assert res.schedule.framework == "horovod"
    obj = schedule_to_dict(res.schedule)
    assert obj["framework"] == "horovod"
    assert schedule_from_dict(obj).framework == "horovod"
    obj["framework"] = "nccl"
    with pytest.raises(InputError) as err:
        schedule_from_dict(obj, where="s.json")
    assert err.value.field == "framework"
    del obj["framework"]
    assert schedule_from_dict(obj).framework is None  # files before the field: replay


# --- the compiler's choice ----------------------------------------------------------------


def test_the_path_at_the_traces_own_cost_is_the_horovod_baseline() -> None:
    """One replay: the framework's path costed like the trace's own calls is the simulator's
    ``horovod`` policy there, plus the step the overlapped replay charges per unit."""
    trace = random_trace(seed=4, n_layers=6, alpha_us=200.0)
    step_us = 5000.0
    trace = dataclasses.replace(
        trace,
        comm=dataclasses.replace(trace.comm, update_us_per_byte=step_us / trace.total_bytes),
    )
    no_update = dataclasses.replace(
        trace, comm=dataclasses.replace(trace.comm, update_us_per_byte=0.0)
    )
    baseline_us = compare(no_update, policies=["horovod"])["horovod"].iteration_us
    assert framework_path_us(_with_path(trace, 1.0)) == pytest.approx(
        baseline_us + step_us, rel=1e-12
    )
    assert framework_path_us(_with_path(no_update, 1.0)) == pytest.approx(baseline_us, rel=1e-12)
    assert framework_path_us(trace) is None


def test_the_paths_own_interference_term_is_charged() -> None:
    trace = random_trace(seed=4, n_layers=6, alpha_us=200.0)
    calm = framework_path_us(_with_path(trace, 1.0))
    busy = framework_path_us(
        _with_path(trace, 1.0, Interference(idle_loss=0.3, comm_us_per_call=1000.0))
    )
    assert calm is not None
    assert busy is not None
    assert busy > calm


@settings(max_examples=20, deadline=None)
@given(
    traces(max_layers=8),
    st.sampled_from([0.05, 0.3, 1.0, 4.0]),
    st.sampled_from([None, 0.0, 0.02, 0.3]),
)
def test_the_units_ship_only_where_they_beat_the_framework_by_the_margin(
    trace: Trace, scale: float, margin: float | None
) -> None:
    given_trace = _with_path(trace, scale)
    res = compile_trace(given_trace, baselines=False, framework_margin=margin)
    plain = compile_trace(given_trace, baselines=False, framework=False)
    # The units and their prediction are the same either way; only the choice differs.
    assert res.schedule.units == plain.schedule.units
    assert res.predicted_iteration_us == plain.predicted_iteration_us
    fw_us = framework_path_us(given_trace)
    assert plain.schedule.framework is None
    assert plain.framework_us == fw_us
    assert res.framework_us == fw_us
    assert fw_us is not None
    used = FRAMEWORK_MARGIN if margin is None else margin
    if res.predicted_iteration_us * (1 + used) > fw_us:
        assert res.schedule.framework == "horovod"
        info = res.schedule.meta["framework"]
        assert info == {
            "predicted_iteration_us": fw_us,
            "replay_us": res.predicted_iteration_us,
            "margin": used,
        }
        assert any("framework's own path" in w for w in res.warnings)
    else:
        assert res.schedule.framework is None
        assert "framework" not in res.schedule.meta


def test_a_gain_inside_the_margin_keeps_the_framework() -> None:
    """Units predicted 3% faster than the path: shipped with no margin, not with the default
    5% (the model's accuracy), shipped again with a margin of 2%."""
    trace = random_trace(seed=2, n_layers=6, alpha_us=300.0)
    units_us = compile_trace(trace, baselines=False).predicted_iteration_us
    # Find the path's cost scale at which it replays 3% slower than the units.
    lo, hi = 0.01, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        fw_us = framework_path_us(_with_path(trace, mid))
        assert fw_us is not None
        lo, hi = (mid, hi) if fw_us < units_us * 1.03 else (lo, mid)
    with_path = _with_path(trace, hi)
    fw_us = framework_path_us(with_path)
    assert fw_us == pytest.approx(units_us * 1.03, rel=1e-3)
    assert compile_trace(with_path, baselines=False).schedule.framework == "horovod"
    for margin, chosen in ((0.0, None), (0.02, None), (0.05, "horovod")):
        res = compile_trace(with_path, baselines=False, framework_margin=margin)
        assert res.schedule.framework == chosen


@pytest.mark.parametrize("margin", [-0.01, math.inf, math.nan])
def test_a_bad_margin_names_its_field(margin: float) -> None:
    with pytest.raises(InputError, match="framework_margin"):
        compile_trace(random_trace(seed=2, n_layers=4), baselines=False, framework_margin=margin)


def test_sync_mode_weighs_the_path_on_the_sync_loop() -> None:
    trace = _with_path(random_trace(seed=2, n_layers=6, alpha_us=300.0), 0.2)
    res = compile_trace(trace, mode="sync", baselines=False)
    assert res.schedule.mode == "sync"
    assert res.schedule.framework == "horovod"
    # The sync loop steps outside the window, as the framework does: nothing added.
    from pace.compiler import sync_trace

    synced = sync_trace(trace)
    comm = dataclasses.replace(
        synced.comm,
        alpha_us=trace.comm.framework.alpha_us,  # type: ignore[union-attr]
        beta_us_per_byte=trace.comm.framework.beta_us_per_byte,  # type: ignore[union-attr]
        framework=None,
    )
    expected = simulate(dataclasses.replace(synced, comm=comm), "horovod").iteration_us
    assert res.framework_us == pytest.approx(expected, rel=1e-12)


def test_a_link_what_if_does_not_weigh_a_path_measured_on_another_link() -> None:
    trace = _with_path(random_trace(seed=2, n_layers=6, alpha_us=300.0), 0.01)
    res = compile_trace(trace, bandwidth_gbps=100.0, baselines=False)
    assert res.schedule.framework is None
    assert res.framework_us is None
    assert any("not weighed" in w for w in res.warnings)


def test_a_drift_replan_never_switches_to_the_framework() -> None:
    from pace.drift.replan import compile_schedule

    trace = _with_path(random_trace(seed=2, n_layers=6, alpha_us=300.0), 0.01)
    assert compile_schedule(trace).framework is None
    assert compile_trace(trace, baselines=False).schedule.framework == "horovod"


# --- pace compile -------------------------------------------------------------------------


def test_pace_compile_reports_the_choice_and_no_framework_turns_it_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace_path = tmp_path / "t.json"
    save_trace(_with_path(random_trace(seed=2, n_layers=6, alpha_us=300.0), 0.2), trace_path)
    out = tmp_path / "s.json"
    assert main(["compile", str(trace_path), "-o", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["framework"] == "horovod"
    assert report["framework_us"] < report["predicted_iteration_us"]
    assert load_schedule(out).framework == "horovod"
    # The marked schedule is still a valid file of its units: validate replays them.
    assert main(["validate", str(out), "--trace", str(trace_path)]) == 0
    assert main(["compile", str(trace_path), "-o", str(out), "--framework-margin", "-1"]) == 2
    assert "--framework-margin" in capsys.readouterr().err
    assert main(["compile", str(trace_path), "-o", str(out), "--no-framework"]) == 0
    text = capsys.readouterr().out
    assert "framework's own path" in text
    assert "trained instead" not in text
    assert load_schedule(out).framework is None


def test_a_hand_marked_schedule_survives_a_save(tmp_path: Path) -> None:
    res = compile_trace(random_trace(seed=3, n_layers=4), baselines=False)
    marked = dataclasses.replace(res.schedule, framework="horovod")
    save_schedule(marked, tmp_path / "s.json")
    assert load_schedule(tmp_path / "s.json").framework == "horovod"


def test_comm_json_carries_the_path_into_what_pace_profile_loads(tmp_path: Path) -> None:
    """``pace profile-comm --framework`` writes the path into comm.json; ``load_comm`` (what
    ``pace profile --comm`` reads) carries it into the trace's comm, and refuses a bad one."""
    from pace.profiler.comm import fit_comm, load_comm, save_comm

    fit = fit_comm([(4096, 300.0), (2**20, 900.0), (2**24, 9000.0)], workers=2)
    path = FrameworkPath(backend="horovod", alpha_us=120.0, beta_us_per_byte=4e-4)
    fit = dataclasses.replace(fit, model=dataclasses.replace(fit.model, framework=path))
    save_comm(fit, tmp_path / "comm.json")
    assert load_comm(tmp_path / "comm.json").framework == path
    obj = json.loads((tmp_path / "comm.json").read_text())
    obj["framework"]["alpha_us"] = "soon"
    (tmp_path / "bad.json").write_text(json.dumps(obj))
    with pytest.raises(InputError) as err:
        load_comm(tmp_path / "bad.json")
    assert err.value.field == "framework.alpha_us"
    assert "bad.json" in str(err.value)
