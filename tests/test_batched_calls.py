"""Horovod's calls negotiated in one cycle: ``CommModel.batched_alpha_us`` in the files, the
comm probe's fit (``fit_batches``) and the simulator's cycle channel, which charges a cycle's
first call ``alpha_us`` and every further one the batched cost."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.cli import main
from pace.compiler import framework_path_us
from pace.errors import InputError
from pace.io import save_trace, trace_from_dict, trace_to_dict
from pace.ir import CommModel, FrameworkPath, Interference, Trace
from pace.profiler.comm import fit_batches, fit_comm, load_comm, save_comm, with_batches
from pace.sim import simulate
from pace.sim.policies import horovod
from pace.synth import random_trace
from tests.strategies import traces
from tests.test_sim import chain_trace

UNFUSED = horovod(threshold_bytes=0, cycle_us=0.0, name="horovod-nofusion")


def _batched(trace: Trace, batched_us: float | None, *, alpha_us: float | None = None) -> Trace:
    comm = dataclasses.replace(
        trace.comm,
        alpha_us=trace.comm.alpha_us if alpha_us is None else alpha_us,
        batched_alpha_us=batched_us,
    )
    return dataclasses.replace(trace, comm=comm)


# --- the files ----------------------------------------------------------------------------


def test_trace_round_trips_the_batched_cost_and_old_files_keep_their_bytes() -> None:
    plain = random_trace(seed=4, n_layers=3)
    assert "batched_alpha_us" not in trace_to_dict(plain)["comm"]
    trace = _batched(plain, 12.5, alpha_us=40.0)
    obj = trace_to_dict(trace)
    assert obj["comm"]["batched_alpha_us"] == 12.5
    assert trace_from_dict(obj).comm == trace.comm
    del obj["comm"]["batched_alpha_us"]
    assert trace_from_dict(obj).comm.batched_alpha_us is None


@pytest.mark.parametrize(
    ("value", "said"),
    [(-1, ">= 0"), ("fast", "must be a number"), (41, "must be <= alpha_us"), (math.inf, "")],
)
def test_a_bad_batched_cost_names_its_field(value: object, said: str) -> None:
    obj = trace_to_dict(_batched(random_trace(seed=4, n_layers=3), None, alpha_us=40.0))
    obj["comm"]["batched_alpha_us"] = value
    with pytest.raises(InputError) as err:
        trace_from_dict(obj)
    assert err.value.field == "comm.batched_alpha_us"
    assert said in str(err.value)


def test_pace_validate_refuses_a_batched_cost_above_alpha(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.trace.json"
    save_trace(_batched(random_trace(seed=4, n_layers=3), None, alpha_us=40.0), path)
    obj = json.loads(path.read_text())
    obj["comm"]["batched_alpha_us"] = 50
    path.write_text(json.dumps(obj))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "comm.batched_alpha_us" in err
    assert "t.trace.json" in err
    assert "Traceback" not in err


def test_comm_json_carries_the_batched_cost_and_refuses_one_above_alpha(tmp_path: Path) -> None:
    fit = fit_comm([(4096, 300.0), (2**20, 900.0), (2**24, 9000.0)], workers=2)
    fit = dataclasses.replace(fit, model=dataclasses.replace(fit.model, batched_alpha_us=7.0))
    save_comm(fit, tmp_path / "comm.json")
    assert load_comm(tmp_path / "comm.json").batched_alpha_us == 7.0
    obj = json.loads((tmp_path / "comm.json").read_text())
    obj["batched_alpha_us"] = obj["alpha_us"] + 1
    (tmp_path / "bad.json").write_text(json.dumps(obj))
    with pytest.raises(InputError) as err:
        load_comm(tmp_path / "bad.json")
    assert err.value.field == "batched_alpha_us"
    assert "bad.json" in str(err.value)


# --- the probe's fit ------------------------------------------------------------------------


@given(
    first=st.floats(100.0, 5000.0),
    further=st.floats(0.0, 2000.0),
    counts=st.lists(st.integers(1, 64), min_size=2, max_size=6, unique=True),
)
def test_fit_batches_recovers_a_line(first: float, further: float, counts: list[int]) -> None:
    # Each count's samples scatter around the line; their median is on it.
    times = {k: [first + further * (k - 1) + d for d in (-9.0, 0.0, 30.0)] for k in counts}
    fit = fit_batches(times)
    assert fit.further_call_us == pytest.approx(further, abs=1e-6)
    assert fit.first_call_us == pytest.approx(first, abs=1e-6)


@given(
    first=st.floats(-500.0, 5000.0),
    further=st.floats(-500.0, 5000.0),
    alpha=st.floats(0.0, 3000.0),
)
def test_with_batches_takes_the_further_calls_share_of_alpha(
    first: float, further: float, alpha: float
) -> None:
    fit = fit_batches({1: [first], 2: [first + further]})
    model = with_batches(CommModel(workers=2, alpha_us=alpha, beta_us_per_byte=1e-3), fit)
    # The line through two points is them: its value at one is `first`, its slope `further`.
    assert fit.first_call_us == pytest.approx(first, abs=1e-6)
    assert fit.further_call_us == pytest.approx(further, abs=1e-6)
    ratio = fit.further_call_us / fit.first_call_us if fit.first_call_us > 0 else 1.0
    share = min(max(0.0, ratio), 1.0)
    assert model.batched_alpha_us == pytest.approx(alpha * share, rel=1e-6, abs=1e-6)
    assert 0.0 <= model.batched_alpha_us <= alpha


def test_a_uniformly_slower_host_during_the_batches_changes_nothing() -> None:
    model = CommModel(workers=2, alpha_us=1000.0, beta_us_per_byte=1e-3)
    times = {k: [1200.0 + 300.0 * (k - 1)] for k in (1, 2, 4, 8, 16)}
    slow = {k: [10 * t for t in ts] for k, ts in times.items()}
    got = with_batches(model, fit_batches(times)).batched_alpha_us
    assert got == pytest.approx(250.0)
    assert with_batches(model, fit_batches(slow)).batched_alpha_us == pytest.approx(got)


def test_fit_batches_needs_two_counts() -> None:
    with pytest.raises(InputError):
        fit_batches({4: [10.0, 11.0]})
    with pytest.raises(InputError):
        fit_batches({1: [10.0], 4: []})


# --- the simulator's cycles -----------------------------------------------------------------


def _two_at_once() -> Trace:
    """Two backward ops of 10 us; the first produces `a` (20 bytes) and `b` (4) together, the
    second `c` (4); alpha 100 us, 1 us per byte."""
    return chain_trace(
        [
            ("bw.layer2", "backward", 10),
            ("bw.layer1", "backward", 10),
            ("fw.layer1", "forward", 5),
            ("fw.layer2", "forward", 5),
        ],
        [
            ("a", 20, "bw.layer2", ("fw.layer2",)),
            ("b", 4, "bw.layer2", ("fw.layer2",)),
            ("c", 4, "bw.layer1", ("fw.layer1",)),
        ],
        alpha=100.0,
    )


def test_a_cycles_further_calls_pay_only_the_batched_cost() -> None:
    """Worked by hand, with fusion off and no cycle wait: `a` and `b` are produced together at
    10 us, one tick: `a` pays alpha (100 + 20 bytes), `b` the batched 10 + 4. `c` (at 20 us)
    waits for that batch and is its own tick's first call: 100 + 4. The forward waits for all
    of them (Horovod's barrier): 10 + 10 us of backward, 248 us for the calls, 10 of forward."""
    trace = _two_at_once()
    res = simulate(_batched(trace, 10.0), UNFUSED)
    durations = [f - s for s, f in zip(res.unit_start_us, res.unit_finish_us, strict=True)]
    assert [u.tensors for u in res.units] == [("a",), ("b",), ("c",)]
    assert durations == pytest.approx([120.0, 14.0, 104.0])
    assert res.iteration_us == pytest.approx(258.0)
    # Unmeasured, every call pays alpha: b 104, then c 104 after it.
    assert simulate(trace, UNFUSED).iteration_us == pytest.approx(10.0 + 120 + 104 + 104 + 10)


def test_a_cycle_pays_the_delay_of_a_call_issued_beside_compute_once() -> None:
    """As above, with calls issued beside compute taking 50 us longer: the tick at 10 us (while
    `bw.layer1` computes) has `a` pay it (170 us), not `b` (14 us), which runs right after on
    the same thread; `c`'s tick at 194 us finds no op computing (the forward waits for every
    call), so no delay: 104 us."""
    trace = _two_at_once()
    comm = dataclasses.replace(
        trace.comm, batched_alpha_us=10.0, interference=Interference(comm_us_per_call=50.0)
    )
    res = simulate(dataclasses.replace(trace, comm=comm), UNFUSED)
    durations = [f - s for s, f in zip(res.unit_start_us, res.unit_finish_us, strict=True)]
    assert durations == pytest.approx([170.0, 14.0, 104.0])
    assert res.iteration_us == pytest.approx(308.0)


@settings(max_examples=60, deadline=None)
@given(trace=traces(max_layers=8), share=st.floats(0.0, 1.0))
def test_every_tick_pays_alpha_once_and_its_other_calls_the_batched_cost(
    trace: Trace, share: float
) -> None:
    """Each unfused call costs alpha or the batched cost on top of its bytes; the first call
    pays alpha; the batched cost equal to alpha replays as unmeasured."""
    alpha = max(trace.comm.alpha_us, 50.0)
    plain = _batched(trace, None, alpha_us=alpha)
    batched = alpha * share
    res = simulate(_batched(trace, batched, alpha_us=alpha), UNFUSED)
    beta = trace.comm.beta_us_per_byte
    fixed = [
        f - s - beta * u.size_bytes
        for u, s, f in zip(res.units, res.unit_start_us, res.unit_finish_us, strict=True)
    ]
    assert fixed[0] == pytest.approx(alpha, rel=1e-6, abs=1e-6)
    for x in fixed:
        assert x == pytest.approx(alpha, rel=1e-6, abs=1e-6) or x == pytest.approx(
            batched, rel=1e-6, abs=1e-6
        )
    same = simulate(_batched(trace, alpha, alpha_us=alpha), UNFUSED)
    assert same.iteration_us == pytest.approx(simulate(plain, UNFUSED).iteration_us)


def test_a_lowered_alpha_caps_the_batched_cost() -> None:
    comm = CommModel(workers=2, alpha_us=30.0, beta_us_per_byte=0.5, batched_alpha_us=80.0)
    assert comm.batched_cost_us(10) == pytest.approx(35.0)
    assert dataclasses.replace(comm, alpha_us=100.0).batched_cost_us(10) == pytest.approx(85.0)


def test_the_framework_path_ignores_the_runtime_settings_batched_cost() -> None:
    """The batched cost was measured under the runtime's settings (fusion and cache off); the
    framework's own path is priced by its own measurement alone."""
    trace = random_trace(seed=9, n_layers=4)
    path = FrameworkPath(
        backend="horovod",
        alpha_us=trace.comm.alpha_us * 2,
        beta_us_per_byte=trace.comm.beta_us_per_byte,
    )
    with_path = dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, framework=path))
    assert framework_path_us(_batched(with_path, 0.0)) == framework_path_us(with_path)


def test_a_what_if_keeps_the_batched_cost_as_it_keeps_alpha() -> None:
    from pace.cost import what_if

    comm = CommModel(workers=2, alpha_us=30.0, beta_us_per_byte=0.5, batched_alpha_us=8.0)
    moved = what_if(comm, bandwidth_gbps=25.0, workers=4)
    assert (moved.alpha_us, moved.batched_alpha_us) == (30.0, 8.0)
