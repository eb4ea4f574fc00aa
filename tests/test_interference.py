"""The interference term: compute slows down while communication runs beside it (issue 15)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.analysis import analyze
from pace.compiler import apply_what_if, best_lower_bound_us, compile_trace
from pace.io import load_trace
from pace.ir import CommModel, Interference, Op, Tensor, Trace
from pace.lp import interference_bound_us, lower_bound_us
from pace.profiler.interference import (
    InterferenceSample,
    drift_corrected_loss,
    fit_interference,
    measure_interference,
)
from pace.sim import SimOptions, schedule_policy, simulate, units_policy
from pace.synth import random_trace
from tests.strategies import traces

STATIC = ("fifo", "tictac", "p3", "ddp", "bytescheduler")


def with_term(trace: Trace, term: Interference | None) -> Trace:
    return dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, interference=term))


def overlap_trace() -> Trace:
    """bw (10 us) produces w (100 B, 100 us on the wire); fw.a (50 us) needs nothing and runs
    beside the transfer; fw.b (5 us) consumes w."""
    return Trace(
        model="overlap",
        ops=(
            Op(name="bw", phase="backward", duration_us=10),
            Op(name="fw.a", phase="forward", duration_us=50, deps=("bw",)),
            Op(name="fw.b", phase="forward", duration_us=5, deps=("fw.a",)),
        ),
        tensors=(Tensor(name="w", size_bytes=100, producer="bw", consumers=("fw.b",)),),
        comm=CommModel(workers=2, alpha_us=0.0, beta_us_per_byte=1.0),
    )


def test_overlapped_compute_slows_by_the_bytes_in_flight() -> None:
    trace = overlap_trace()
    assert simulate(trace, "tictac").iteration_us == 115.0  # w done at 110, fw.b 110..115
    # 0.2 us of compute lost per byte: 20 us over the 100 us transfer, fw.a runs at 0.8.
    slow = with_term(trace, Interference(us_per_byte=0.2))
    res = simulate(slow, "tictac")
    assert res.op_finish_us[1] == pytest.approx(10 + 50 / 0.8)
    assert res.iteration_us == pytest.approx(115.0)  # fw.a still ends before w arrives
    # Per call: 60 us lost over the transfer; fw.a runs at 0.4 until 110, then at full speed.
    slower = with_term(trace, Interference(us_per_call=60.0))
    res = simulate(slower, "tictac")
    done_by_110 = 100 * 0.4
    assert res.op_finish_us[1] == pytest.approx(110 + (50 - done_by_110))
    assert res.iteration_us == pytest.approx(110 + 10 + 5)


@pytest.mark.parametrize("policy", ["tictac", "horovod"])
def test_communication_slows_beside_compute(policy: str) -> None:
    """comm_stretch 1: the transfer runs at half speed while fw.a computes (10..60 us): 25 B by
    60 us, the other 75 B at full speed, done at 135 us (Horovod's thread: the same unit)."""
    trace = with_term(overlap_trace(), Interference(comm_stretch=1.0))
    res = simulate(trace, policy, options=SimOptions(barrier=False))
    assert res.unit_finish_us[-1] == pytest.approx(135.0)
    assert res.iteration_us == pytest.approx(140.0)


@pytest.mark.parametrize("policy", ["tictac", "horovod"])
def test_a_call_issued_beside_compute_takes_longer(policy: str) -> None:
    """comm_us_per_call 20: w's call starts at 10 us while fw.a computes: 120 us of work."""
    trace = with_term(overlap_trace(), Interference(comm_us_per_call=20.0))
    res = simulate(trace, policy, options=SimOptions(barrier=False))
    assert res.unit_finish_us[-1] == pytest.approx(130.0)
    assert res.iteration_us == pytest.approx(135.0)


@pytest.mark.parametrize("policy", ["tictac", "horovod"])
def test_a_calls_loss_is_spread_over_its_whole_time(policy: str) -> None:
    """comm_us_per_call 100: w's call, issued at 10 us beside fw.a, holds the channel 200 us
    (10..210); the 40 us of compute it costs (0.4 us per byte) are spread over those 200 us, not
    over its 100 us of bytes: fw.a runs at 0.8 and ends at 10 + 50 / 0.8 = 72.5 us (the static
    channel once charged 40 us per 100, ending fw.a at 93.3 us: 1 + extra / cost times the loss
    the probe measured per call)."""
    term = Interference(us_per_byte=0.4, comm_us_per_call=100.0)
    res = simulate(with_term(overlap_trace(), term), policy, options=SimOptions(barrier=False))
    assert res.unit_finish_us[-1] == pytest.approx(210.0)
    assert res.op_finish_us[1] == pytest.approx(72.5)
    assert res.iteration_us == pytest.approx(215.0)


def test_horovods_units_replay_alike_in_either_channel() -> None:
    """A trace measured on the throttled link (``bench_netns.py --rates 2gbit --backends torch
    --keep``: VGG for CIFAR, 2 ranks, 2 Gbit/s; its term charges 2.4 ms per call issued beside
    compute): Horovod's cycle-fused units, replayed as fixed units behind the same barrier,
    take the time Horovod's channel gives them (the anchor of its tick grid aside: 0.1%). With
    the loss spread over the bytes' time alone the fixed units took 2.9% longer (649.0 against
    630.6 ms), so every compiled schedule was charged more compute than the probe measured."""
    trace = load_trace(Path(__file__).parent / "data" / "vgg_cifar_2gbit_torch.trace.json.gz")
    assert trace.comm.interference is not None
    assert trace.comm.interference.comm_us_per_call > 1e3
    horovod = simulate(trace, "horovod")
    units = [dataclasses.replace(u, priority=float(i)) for i, u in enumerate(horovod.units)]
    fixed = simulate(trace, units_policy(units), options=SimOptions(barrier=True))
    assert fixed.iteration_us == pytest.approx(horovod.iteration_us, rel=2e-3)


def test_loss_is_capped() -> None:
    term = Interference(us_per_call=1e9)
    assert term.compute_loss([(1, 10.0)]) == pytest.approx(0.95)
    assert Interference().active is False


@settings(max_examples=40, deadline=None)
@given(traces(), st.floats(min_value=0.0, max_value=0.6), st.sampled_from(STATIC))
def test_idle_loss_alone_is_slower_compute(trace: Trace, idle: float, policy: str) -> None:
    """A constant loss with no busy term is the same as every op that much slower."""
    got = simulate(with_term(trace, Interference(idle_loss=idle)), policy).iteration_us
    want = simulate(apply_what_if(trace, compute_speedup=1.0 - idle), policy).iteration_us
    assert got == pytest.approx(want, rel=1e-9, abs=1e-6)


@settings(max_examples=40, deadline=None)
@given(traces(), st.sampled_from(STATIC))
def test_a_vanishing_term_is_the_independent_model(trace: Trace, policy: str) -> None:
    """The event loop with a negligible term agrees with the fast replay (Lemma 1's split)."""
    got = simulate(with_term(trace, Interference(idle_loss=1e-15)), policy).iteration_us
    assert got == pytest.approx(simulate(trace, policy).iteration_us, rel=1e-9, abs=1e-6)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.floats(min_value=1e-5, max_value=2e-3))
def test_the_compiler_optimises_with_the_term(seed: int, per_byte: float) -> None:
    """Compiled with interference, the prediction is the simulator's replay of the schedule
    on that trace, and no baseline replays faster there (the compiler's guarantee)."""
    trace = with_term(
        random_trace(seed=seed, n_layers=8, alpha_us=20.0),
        Interference(us_per_byte=per_byte, us_per_call=5.0),
    )
    res = compile_trace(trace)
    replay = simulate(trace, schedule_policy(res.schedule)).iteration_us
    assert res.predicted_iteration_us == pytest.approx(replay, rel=1e-12)
    assert all(res.predicted_iteration_us <= us * (1 + 1e-9) for us in res.baselines.values()) or (
        any("replays faster" in w for w in res.warnings)
    )
    assert math.isfinite(res.lower_bound_us)


terms = st.builds(
    Interference,
    us_per_byte=st.floats(0.0, 5.0),
    us_per_call=st.floats(0.0, 1e4),
    idle_loss=st.floats(0.0, 0.99),
    comm_stretch=st.floats(0.0, 2.0),
    comm_us_per_call=st.floats(0.0, 1e3),
)


@settings(max_examples=60, deadline=None)
@given(
    traces(),
    terms,
    st.sampled_from([*STATIC, "horovod"]),
    st.sampled_from([SimOptions(), SimOptions(one_compute_stream=True)]),
)
def test_no_policy_beats_the_interference_bound(
    trace: Trace, term: Interference, policy: str, options: SimOptions
) -> None:
    """Whatever the term (the cap included), fusion, credit or compute stream, no replay is
    faster than ``interference_bound_us``, and the compiled schedule neither."""
    trace = with_term(trace, term)
    bound = interference_bound_us(trace)
    assert lower_bound_us(trace) >= bound
    got = simulate(trace, policy, options=options).iteration_us
    assert got >= bound * (1 - 1e-9) - 1e-6


@settings(max_examples=15, deadline=None)
@given(traces(max_layers=6), terms)
def test_the_compiled_schedule_respects_the_interference_bound(
    trace: Trace, term: Interference
) -> None:
    trace = with_term(trace, term)
    res = compile_trace(trace, baselines=False)
    assert res.predicted_iteration_us >= res.lower_bound_us * (1 - 1e-9) - 1e-6
    assert res.lower_bound_us >= interference_bound_us(trace)


def test_the_interference_bound_where_compute_dominates() -> None:
    """VGG-16 on a link fast enough that compute dominates: the zero-overhead bound is the
    critical path, and a term with idle loss 0.2 and 1 us lost per KiB beside compute raises
    the bound by cp * 0.25 + bytes * min(0.75 * beta, 1/1024) / 0.8."""
    base = load_trace(Path(__file__).resolve().parents[1] / "traces" / "vgg16.json.gz")
    fast = apply_what_if(base, bandwidth_gbps=400.0)
    cp = analyze(fast).critical_path_us
    assert lower_bound_us(fast) == pytest.approx(cp)
    term = Interference(idle_loss=0.2, us_per_byte=1 / 1024)
    slow = with_term(fast, term)
    beta = fast.comm.beta_us_per_byte
    total = sum(t.size_bytes for t in fast.tensors)
    want = cp / 0.8 + total * min(min(0.75 * beta, 1 / 1024) / 0.8, beta)
    assert interference_bound_us(slow) == pytest.approx(want)
    assert lower_bound_us(slow) == pytest.approx(want)
    assert best_lower_bound_us(slow) == (pytest.approx(want), "interference")
    assert simulate(slow, "tictac").iteration_us >= want


def test_fit_recovers_the_term() -> None:
    """Samples generated from a known term fit back to it."""
    per_call, per_byte, idle, extra, stretch = 40.0, 3e-3, 0.1, 900.0, 0.05
    samples = []
    for size in (2**18, 2**20, 2**22, 2**24):
        alone_us = 50.0 + size * 8e-3
        call_us = extra + (1 + stretch) * alone_us
        loss = idle + (per_call + per_byte * size) / call_us
        samples.append(
            InterferenceSample(
                size_bytes=size, call_us=call_us, loss=loss, probes=9, alone_us=alone_us
            )
        )
    term, r2 = fit_interference(100.0, 100.0 / (1 - idle), samples)
    assert term.idle_loss == pytest.approx(idle)
    assert term.us_per_call == pytest.approx(per_call, rel=1e-6)
    assert term.us_per_byte == pytest.approx(per_byte, rel=1e-6)
    assert term.comm_us_per_call == pytest.approx(extra, rel=1e-6)
    assert term.comm_stretch == pytest.approx(stretch, rel=1e-6)
    assert r2 == pytest.approx(1.0)


@settings(max_examples=200, deadline=None)
@given(
    plain=st.floats(100.0, 1e6),
    idle_factor=st.floats(1.0, 3.0),
    slowdown=st.floats(1.0, 5.0),
    drift=st.floats(0.2, 5.0),
)
def test_a_drift_shared_by_busy_and_its_reference_cancels(
    plain: float, idle_factor: float, slowdown: float, drift: float
) -> None:
    """The loss beside the calls depends on busy / ref, not on how fast the machine ran then."""
    idle = plain * idle_factor
    at_rest = drift_corrected_loss(
        plain_us=plain, idle_us=idle, ref_us=idle, busy_us=idle * slowdown
    )
    drifted = drift_corrected_loss(
        plain_us=plain, idle_us=idle, ref_us=idle * drift, busy_us=idle * slowdown * drift
    )
    assert drifted == pytest.approx(at_rest, rel=1e-9, abs=1e-12)
    assert at_rest == pytest.approx(1.0 - plain / (idle * slowdown), abs=1e-12)


def test_measuring_on_a_drifting_machine_gives_the_calls_slowdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A probe that slows down steadily (the machine drifting) and 1.25x more while all-reduces
    run: the loss attributed to the calls is the 1.25x, not the drift since the plain probe.

    On a virtual clock that only the probe advances, and with each all-reduce beside compute
    lasting exactly three probes, so the host's load cannot move the result."""
    import threading
    import types

    from pace.profiler import interference

    now = [0.0]
    monkeypatch.setattr(interference, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    calls_running = threading.Event()
    done = threading.Condition()
    count = [0]
    beside_calls = [0]

    def probe() -> None:
        drift = 1.0 + 0.04 * (count[0] + 1)
        now[0] += 0.002 * drift * (1.25 if calls_running.is_set() else 1.0)
        with done:
            count[0] += 1
            done.notify_all()

    def allreduce(buf: object) -> None:
        if threading.current_thread().name != "pace-interference-comm":
            now[0] += 0.01  # alone: the rank's own timing of the calls
            return
        calls_running.set()  # stays set through the burst of six calls
        with done:
            target = count[0] + 3
            if not done.wait_for(lambda: count[0] >= target, timeout=30):
                raise TimeoutError("the probe stopped")
        beside_calls[0] += 1
        if beside_calls[0] % 6 == 0:
            calls_running.clear()

    idle_us, samples = measure_interference(
        allreduce,
        sizes_bytes=[1024, 4096],
        calls=[6, 6],
        plain_us=2000.0,
        probe=probe,
        idle_reps=9,
    )
    assert count[0] > 30
    assert idle_us > 2000.0 * 1.5  # the drift is large against the plain probe ...
    for s in samples:
        assert s.probes >= 15
        # ... but 1 - loss = (plain / idle) * (ref / busy) recovers ref / busy = 1 / 1.25.
        ratio = (1.0 - s.loss) / (2000.0 / idle_us)
        assert ratio == pytest.approx(1 / 1.25, abs=0.05)


def test_the_term_round_trips_through_the_trace_format() -> None:
    from pace.io import trace_from_dict, trace_to_dict

    term = Interference(
        us_per_byte=1e-3,
        us_per_call=4.0,
        idle_loss=0.1,
        comm_stretch=0.3,
        comm_us_per_call=900.0,
        samples=((1024, 0.2),),
    )
    trace = with_term(overlap_trace(), term)
    obj = trace_to_dict(trace)
    assert obj["comm"]["interference"]["version"] == 1
    assert trace_from_dict(obj).comm == trace.comm
    # A trace without the term writes none and reads back without it (old files unchanged).
    plain = trace_to_dict(overlap_trace())
    assert "interference" not in plain["comm"]
    assert trace_from_dict(plain).comm.interference is None


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("version", 2, "version 2 is not supported"),
        ("idle_loss", 0.99, "must be <= 0.95"),
        ("us_per_byte", -1, "must be >= 0"),
        ("comm_stretch", "fast", "must be a number"),
    ],
)
def test_a_bad_term_names_its_field(key: str, value: object, message: str) -> None:
    from pace.errors import InputError
    from pace.io import trace_from_dict, trace_to_dict

    obj = trace_to_dict(with_term(overlap_trace(), Interference(idle_loss=0.1)))
    obj["comm"]["interference"][key] = value
    with pytest.raises(InputError, match=message) as info:
        trace_from_dict(obj, where="t.json")
    assert info.value.field == f"comm.interference.{key}"


def test_profile_comm_measures_the_term_on_real_processes(tmp_path: Path) -> None:
    """`pace profile-comm --interference`: two real gloo ranks, the fitted term in comm.json,
    read back by `load_comm` (what `pace profile --comm` puts in the trace)."""
    from pace.cli import main
    from pace.profiler.comm import load_comm

    out = tmp_path / "comm.json"
    argv = ["profile-comm", "--backend", "gloo", "--workers", "2", "--sizes", "64K,1M"]
    assert main([*argv, "--reps", "2", "--interference", "-o", str(out)]) == 0
    term = load_comm(out).interference
    assert term is not None
    assert [b for b, _ in term.samples] == [65536, 1048576]
    assert all(0.0 <= loss <= 1.0 for _, loss in term.samples)
    assert 0.0 <= term.idle_loss <= 0.95
    assert min(term.us_per_byte, term.comm_us_per_call, term.comm_stretch) >= 0
