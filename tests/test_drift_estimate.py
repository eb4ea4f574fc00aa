"""Observed statistics -> re-estimated trace; the stats.json format; the monitor's ring buffers."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.drift.estimate import (
    EstimateOptions,
    Estimator,
    IterationStats,
    ObservedStats,
    apply_estimate,
    estimate,
    reestimate,
    trace_spans,
    warp_backward,
)
from pace.drift.monitor import Monitor
from pace.errors import InputError
from pace.ir import Interference, Schedule, Trace
from pace.synth import random_trace
from tests.strategies import shuffled_priorities, traces

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "drift-stats.json"


def _observe(
    trace: Trace,
    *,
    fw_scale: float,
    bw_scale: float,
    alpha_us: float,
    beta: float,
    n: int,
    jitter: float,
    seed: int,
    outliers: float = 0.0,
) -> ObservedStats:
    """What a monitor would record in a world of ``trace`` scaled, with multiplicative jitter."""
    rng = random.Random(seed)
    spans = trace_spans(trace)

    def j() -> float:
        x = 1 + rng.uniform(-jitter, jitter)
        if rng.random() < outliers:
            x *= 3  # a slow step (GC pause, preemption)
        return x

    its = []
    for i in range(n):
        units = tuple((t.size_bytes, (alpha_us + beta * t.size_bytes) * j()) for t in trace.tensors)
        its.append(
            IterationStats(
                iteration=i,
                iteration_us=1000.0 * j(),
                backward_us=spans.backward_us * bw_scale * j(),
                forward_us=spans.forward_us * fw_scale * j(),
                grad_ready_us={name: r * bw_scale * j() for name, r in spans.ready_us.items()},
                unit_samples=units,
            )
        )
    return ObservedStats(iterations=tuple(its))


@settings(max_examples=60)
@given(
    trace=traces(max_layers=8),
    fw=st.floats(0.3, 3.0),
    bw=st.floats(0.3, 3.0),
    beta_factor=st.floats(0.25, 4.0),
    seed=st.integers(0, 2**16),
)
def test_recovers_scales_and_comm_without_jitter(
    trace: Trace, fw: float, bw: float, beta_factor: float, seed: int
) -> None:
    beta = trace.comm.beta_us_per_byte * beta_factor
    stats = _observe(
        trace, fw_scale=fw, bw_scale=bw, alpha_us=25.0, beta=beta, n=5, jitter=0.0, seed=seed
    )
    est = estimate(trace, stats)
    spans = trace_spans(trace)
    if spans.forward_us > 0:
        assert est.forward_scale == pytest.approx(fw, rel=1e-9)
    if spans.backward_us > 0:
        assert est.backward_scale == pytest.approx(bw, rel=1e-9)
    if len({t.size_bytes for t in trace.tensors}) >= 2:
        assert est.alpha_us == pytest.approx(25.0, rel=1e-6, abs=1e-6)
        assert est.beta_us_per_byte == pytest.approx(beta, rel=1e-6)
    new = apply_estimate(trace, est)
    new_spans = trace_spans(new)
    assert new_spans.backward_us == pytest.approx(spans.backward_us * est.backward_scale)
    assert [t.name for t in new.tensors] == [t.name for t in trace.tensors]
    assert new.comm.workers == trace.comm.workers


def test_median_is_robust_to_jitter_and_outliers() -> None:
    trace = random_trace(seed=11, n_layers=12)
    beta = trace.comm.beta_us_per_byte * 2  # bandwidth halved
    stats = _observe(
        trace,
        fw_scale=1.3,
        bw_scale=0.8,
        alpha_us=30.0,
        beta=beta,
        n=20,
        jitter=0.05,
        seed=3,
        outliers=0.15,
    )
    est = estimate(trace, stats)
    assert est.forward_scale == pytest.approx(1.3, rel=0.05)
    assert est.backward_scale == pytest.approx(0.8, rel=0.05)
    assert est.beta_us_per_byte == pytest.approx(beta, rel=0.08)
    # The mean would be dragged up by the 3x outliers; the median is not.
    assert est.observed_iteration_us == pytest.approx(1000.0, rel=0.05)


def test_grad_ready_times_stand_in_for_missing_backward_span() -> None:
    trace = random_trace(seed=12, n_layers=6)
    stats = _observe(
        trace, fw_scale=1.0, bw_scale=1.7, alpha_us=5.0, beta=1e-3, n=4, jitter=0.0, seed=1
    )
    stats = ObservedStats(
        iterations=tuple(dataclasses.replace(it, backward_us=None) for it in stats.iterations)
    )
    assert estimate(trace, stats).backward_scale == pytest.approx(1.7)


def test_single_size_keeps_alpha_and_too_few_samples_keep_comm() -> None:
    trace = random_trace(seed=13, n_layers=3, alpha_us=20.0)
    its = tuple(
        IterationStats(iteration=i, iteration_us=100.0, unit_samples=((1000, 120.0),))
        for i in range(3)
    )
    est = estimate(trace, ObservedStats(iterations=its))
    assert est.alpha_us == 20.0
    assert est.beta_us_per_byte == pytest.approx(0.1)
    # No unit observed: the trace's comm model stays.
    bare = ObservedStats(iterations=(IterationStats(iteration=0, iteration_us=1.0),))
    est = estimate(trace, bare)
    assert (est.alpha_us, est.beta_us_per_byte) == (20.0, trace.comm.beta_us_per_byte)
    assert (est.forward_scale, est.backward_scale) == (1.0, 1.0)


def test_window_uses_most_recent_iterations() -> None:
    trace = random_trace(seed=14, n_layers=4)
    old = _observe(trace, fw_scale=1, bw_scale=1, alpha_us=0, beta=1e-3, n=30, jitter=0, seed=0)
    new = _observe(trace, fw_scale=2, bw_scale=2, alpha_us=0, beta=1e-3, n=5, jitter=0, seed=0)
    both = ObservedStats(iterations=old.iterations + new.iterations)
    assert estimate(trace, both, EstimateOptions(window=5)).backward_scale == pytest.approx(2.0)
    assert estimate(trace, both.last(5)).backward_scale == pytest.approx(2.0)
    assert estimate(trace, both).backward_scale == pytest.approx(1.0)  # window 20: still old


def test_estimator_ewma() -> None:
    trace = random_trace(seed=15, n_layers=4)

    def obs(scale: float) -> ObservedStats:
        return _observe(
            trace, fw_scale=scale, bw_scale=scale, alpha_us=0, beta=1e-3, n=3, jitter=0, seed=0
        )

    est = Estimator(trace, EstimateOptions(ewma_weight=0.5))
    assert est.trace_estimate() is trace
    assert est.update(obs(1.0)).backward_scale == pytest.approx(1.0)
    assert est.update(obs(2.0)).backward_scale == pytest.approx(1.5)
    assert est.update(obs(2.0)).backward_scale == pytest.approx(1.75)
    assert trace_spans(est.trace_estimate()).backward_us == pytest.approx(
        trace_spans(trace).backward_us * 1.75
    )


def test_no_iterations_is_an_input_error() -> None:
    with pytest.raises(InputError, match="no observed iteration"):
        estimate(random_trace(seed=1, n_layers=2), ObservedStats(iterations=()))


# -- stats.json ----------------------------------------------------------------------------


def test_stats_json_round_trip(tmp_path: Path) -> None:
    trace = random_trace(seed=16, n_layers=4)
    stats = _observe(trace, fw_scale=1, bw_scale=1, alpha_us=3, beta=1e-3, n=4, jitter=0.1, seed=2)
    stats = dataclasses.replace(stats, trace_digest="abc", meta={"rank": 0})
    path = tmp_path / "stats.json"
    stats.dump(path)
    back = ObservedStats.load(path)
    assert back == stats
    assert back.meta == {"rank": 0}
    assert reestimate(trace, back).comm == reestimate(trace, stats).comm


def test_documented_example_loads() -> None:
    stats = ObservedStats.load(EXAMPLE)
    assert len(stats.iterations) >= 2
    assert all(it.unit_samples for it in stats.iterations)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(format="pace.trace"), "format"),
        (lambda d: d.update(version=2), "version"),
        (lambda d: d.update(iterations={}), "iterations"),
        (lambda d: d["iterations"][0].update(iteration_us=-1), "iterations[0].iteration_us"),
        (lambda d: d["iterations"][0].update(iteration=1.5), "iterations[0].iteration"),
        (lambda d: d["iterations"][1].update(units=[[0, 3.0]]), "iterations[1].units[0]"),
        (lambda d: d["iterations"][1].update(units=[[10]]), "iterations[1].units[0]"),
        (lambda d: d["iterations"][0].update(forward_us="x"), "iterations[0].forward_us"),
        (
            lambda d: d["iterations"][0].update(grad_ready_us={"w": True}),
            "iterations[0].grad_ready_us.w",
        ),
    ],
)
def test_bad_stats_name_file_and_field(tmp_path: Path, mutate: object, field: str) -> None:
    obj = json.loads(EXAMPLE.read_text())
    mutate(obj)  # type: ignore[operator]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(InputError) as info:
        ObservedStats.load(path)
    assert info.value.where == str(path)
    assert info.value.field == field


def test_truncated_stats_file(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(EXAMPLE.read_text()[:50])
    with pytest.raises(InputError):
        ObservedStats.load(path)


# -- monitor -------------------------------------------------------------------------------


def test_monitor_ring_wraps_and_keeps_last_iterations() -> None:
    names = ["a", "b", "c"]
    mon = Monitor(names, capacity=4, trace_digest="d")
    t = 0.0
    mon.on_iteration_start(t)
    for i in range(10):
        mon.on_backward_start(t)
        for k, n in enumerate(names):
            if i % 3 == 0 and n == "c":
                continue  # a missing event stays missing, not stale from 4 iterations ago
            mon.on_grad_ready(n if k % 2 else k, t + 10 * (k + 1))
        mon.on_backward_end(t + 30)
        mon.on_unit_done(0, 100 * (i + 1), float(i))
        mon.on_forward_compute(5.0 + i)
        t += 100.0 + i
        assert mon.on_iteration_end(t) == pytest.approx(100.0 + i)
    snap = mon.snapshot()
    assert snap.trace_digest == "d"
    assert [it.iteration for it in snap.iterations] == [6, 7, 8, 9]
    assert [it.iteration_us for it in snap.iterations] == [106.0, 107.0, 108.0, 109.0]
    assert snap.iterations[-1].unit_samples == ((1000, 9.0),)
    assert snap.iterations[-1].forward_us == 14.0
    assert snap.iterations[-1].backward_us == 30.0
    assert dict(snap.iterations[0].grad_ready_us) == {"a": 10.0, "b": 20.0}  # iteration 6
    assert dict(snap.iterations[1].grad_ready_us) == {"a": 10.0, "b": 20.0, "c": 30.0}
    assert [it.iteration for it in mon.snapshot(last=2).iterations] == [8, 9]
    assert mon.iterations_seen == 10


def test_monitor_first_end_without_start_is_dropped(tmp_path: Path) -> None:
    mon = Monitor(["x"], capacity=3)
    mon.on_iteration_end(5.0)  # no start known: time unknown
    mon.on_iteration_end(15.0)
    snap = mon.snapshot()
    assert [it.iteration_us for it in snap.iterations] == [10.0]
    mon.dump(str(tmp_path / "s.json"))
    assert ObservedStats.load(tmp_path / "s.json") == snap


def test_monitor_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Monitor(["a"], capacity=0)
    with pytest.raises(ValueError, match="unique"):
        Monitor(["a", "a"])


@settings(max_examples=60)
@given(
    trace=traces(max_layers=8),
    stretch=st.floats(0.0, 1.0),
    per_call_us=st.floats(0.0, 5000.0),
    seed=st.integers(0, 2**16),
)
def test_units_beside_compute_refit_the_idle_link(
    trace: Trace, stretch: float, per_call_us: float, seed: int
) -> None:
    """Units observed as the model charges them beside compute give back the idle link: the
    replay charges the interference term itself, so it must not also be in alpha and beta."""
    term = Interference(comm_stretch=stretch, comm_us_per_call=per_call_us)
    trace = dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, interference=term))
    idle = _observe(
        trace, fw_scale=1.0, bw_scale=1.0, alpha_us=25.0, beta=2e-3, n=3, jitter=0.0, seed=seed
    )
    beside = dataclasses.replace(
        idle,
        iterations=tuple(
            dataclasses.replace(
                it,
                unit_samples=tuple(
                    (b, (1 + stretch) * us + per_call_us) for b, us in it.unit_samples
                ),
            )
            for it in idle.iterations
        ),
    )
    est = estimate(trace, beside)
    if len({t.size_bytes for t in trace.tensors}) >= 2:
        assert est.alpha_us == pytest.approx(25.0, rel=1e-6, abs=1e-6)
        assert est.beta_us_per_byte == pytest.approx(2e-3, rel=1e-6)


def test_reestimating_the_models_own_units_gives_back_its_link() -> None:
    """Observe only the units of VGG-16's replay (x30 compute) with an interference term and
    re-estimate the link: compared with the running schedule's replay, the same link and the
    same iteration. Fitting the raw durations instead puts the term's charge into alpha and
    beta (here 5.4% slower); taking every unit back as if beside compute all along (what the
    estimate does without the running schedule) errs the other way where some ran alone
    (here 3.9% faster), which is why `pace recompile` warns without `--schedule`."""
    trace, sched = _vgg_with_term()
    full, iteration_us = _observe_replay(trace, sched)
    stats = ObservedStats(
        iterations=tuple(
            IterationStats(iteration=i, iteration_us=it.iteration_us, unit_samples=it.unit_samples)
            for i, it in enumerate(full.iterations)
        )
    )

    def replayed(est_trace: Trace, stats: ObservedStats, running: Schedule | None) -> float:
        from pace.sim import schedule_policy, simulate

        est = estimate(est_trace, stats, running=running)
        comm = dataclasses.replace(
            trace.comm, alpha_us=est.alpha_us, beta_us_per_byte=est.beta_us_per_byte
        )
        again = dataclasses.replace(trace, comm=comm)
        return simulate(again, schedule_policy(sched)).iteration_us

    assert replayed(trace, stats, sched) == pytest.approx(iteration_us, rel=1e-6)
    no_term = dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, interference=None))
    assert replayed(no_term, stats, None) > 1.02 * iteration_us


def _observe_replay(trace: Trace, sched: Schedule, n: int = 3) -> tuple[ObservedStats, float]:
    """What the monitor records when the world is exactly the runtime's replay of ``sched``
    (strictly in priority order): forward compute (time any forward op runs), backward span,
    each gradient's ready time and units."""
    from pace.analysis import analyze
    from pace.sim import covered_us, schedule_policy, simulate

    res = simulate(trace, schedule_policy(sched, in_order=True))
    an = analyze(trace)
    phases = [o.phase for o in trace.ops]
    fw = covered_us(
        (res.op_start_us[i], res.op_finish_us[i]) for i, p in enumerate(phases) if p == "forward"
    )
    bw = max((res.op_finish_us[i] for i, p in enumerate(phases) if p == "backward"), default=0.0)
    ready = {
        an.tensor_names[k]: res.op_finish_us[i] for i, ks in enumerate(an.produces) for k in ks
    }
    units = tuple(
        (sum(s.size_bytes for s in u.slices), res.unit_finish_us[i] - res.unit_start_us[i])
        for i, u in enumerate(res.units)
    )
    its = tuple(
        IterationStats(
            iteration=i,
            iteration_us=res.iteration_us,
            backward_us=bw,
            forward_us=fw,
            grad_ready_us=ready,
            unit_samples=units,
        )
        for i in range(n)
    )
    return ObservedStats(iterations=its), res.iteration_us


def _vgg_with_term() -> tuple[Trace, Schedule]:
    from pace.compiler import apply_what_if, compile_trace
    from pace.io import load_trace

    base = apply_what_if(
        load_trace(Path(__file__).resolve().parents[1] / "traces" / "vgg16.json.gz"),
        compute_speedup=30.0,
    )
    term = Interference(us_per_byte=5e-4, us_per_call=300.0, comm_stretch=0.1, comm_us_per_call=1e3)
    trace = dataclasses.replace(base, comm=dataclasses.replace(base.comm, interference=term))
    return trace, compile_trace(trace, baselines=False).schedule


def test_the_running_schedules_own_prediction_is_a_fixed_point() -> None:
    """Observe everything the monitor records of VGG-16's replay with an interference term:
    compared with the replay of the running schedule, nothing drifted (scales 1, the same link)
    and the re-estimated trace replays the same iteration. Compared with the ideal spans
    instead, the slowdown the term causes is taken for drift and charged twice."""
    from pace.sim import schedule_policy, simulate

    trace, sched = _vgg_with_term()
    stats, iteration_us = _observe_replay(trace, sched)
    est = estimate(trace, stats, running=sched)
    assert est.forward_scale == pytest.approx(1.0, rel=1e-9)
    assert est.backward_scale == pytest.approx(1.0, rel=1e-9)
    assert est.alpha_us == pytest.approx(trace.comm.alpha_us, rel=1e-6)
    assert est.beta_us_per_byte == pytest.approx(trace.comm.beta_us_per_byte, rel=1e-6)
    again = simulate(apply_estimate(trace, est), schedule_policy(sched)).iteration_us
    assert again == pytest.approx(iteration_us, rel=1e-6)

    naive = estimate(trace, stats)
    # The slowdown of forward and backward beside the units, taken for drift:
    assert naive.forward_scale > 1.2
    assert naive.backward_scale > 1.2
    twice = simulate(apply_estimate(trace, naive), schedule_policy(sched)).iteration_us
    # Charged twice, the replay is 7.5% slower (the compiled order holds back one unit: it was
    # over 10% before the order search, which makes the schedule less sensitive to compute).
    assert twice > 1.05 * iteration_us


@settings(max_examples=40, deadline=None)
@given(
    trace=traces(max_layers=6),
    per_byte=st.floats(0.0, 5e-3),
    per_call=st.floats(0.0, 500.0),
    idle=st.floats(0.0, 0.3),
    stretch=st.floats(0.0, 0.5),
    call_delay=st.floats(0.0, 2000.0),
    shuffle=st.booleans(),
    rnd=st.randoms(use_true_random=False),
)
def test_observing_the_running_schedules_replay_estimates_no_drift(
    *,
    trace: Trace,
    per_byte: float,
    per_call: float,
    idle: float,
    stretch: float,
    call_delay: float,
    shuffle: bool,
    rnd: random.Random,
) -> None:
    """Whatever the interference term, a world that is exactly the runtime's replay of the
    running schedule is estimated as no drift: phase scales 1 and the trace's own link; and
    ``pace recompile --schedule`` predicts the running schedule at the iteration observed.
    Drifted timings leave a schedule's priorities out of its replay's start order; shuffled
    priorities stand for that (the runtime then issues strictly in priority order)."""
    from pace.compiler import compile_trace
    from pace.drift.offline import recompile

    term = Interference(
        us_per_byte=per_byte,
        us_per_call=per_call,
        idle_loss=idle,
        comm_stretch=stretch,
        comm_us_per_call=call_delay,
    )
    trace = dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, interference=term))
    sched = compile_trace(trace, baselines=False).schedule
    if shuffle:
        sched = shuffled_priorities(sched, rnd)
    stats, iteration_us = _observe_replay(trace, sched)
    est = estimate(trace, stats, running=sched)
    assert est.forward_scale == pytest.approx(1.0, rel=1e-9)
    assert est.backward_scale == pytest.approx(1.0, rel=1e-9)
    if len(est.comm_points) >= 2:
        assert est.alpha_us == pytest.approx(trace.comm.alpha_us, rel=1e-6, abs=1e-6)
    assert est.beta_us_per_byte == pytest.approx(trace.comm.beta_us_per_byte, rel=1e-6)
    assert recompile(trace, stats, current=sched).current_us == pytest.approx(
        iteration_us, rel=1e-6
    )


def test_units_beside_a_per_call_delay_and_alone_give_the_links_cost_back() -> None:
    """Found by hypothesis: one size of unit, two of its calls charged the per-call delay
    beside the backward (578 us) and two alone on the idle link (26 us, its cost). Taken back
    one by one, the alone ones clipped at 0 and the median landed between (43 us): beta off
    by 2.3x. The median of the durations, then the replay's charge, gives the cost exactly."""
    from pace.compiler import compile_trace
    from tests.test_sim import chain_trace

    term = Interference(comm_stretch=0.5, comm_us_per_call=359.0, us_per_byte=0.0039)
    chain = chain_trace(
        [
            ("bw.l1", "backward", 37.2),
            ("bw.l0", "backward", 993.7),
            ("fw.l0", "forward", 90.7),
            ("fw.l1", "forward", 44.1),
        ],
        [(f"l1.p{i}", b, "bw.l1", ("fw.l1",)) for i, b in enumerate((25692, 5608, 4300))],
    )
    trace = dataclasses.replace(
        chain,
        comm=dataclasses.replace(
            chain.comm, workers=8, alpha_us=14.0, beta_us_per_byte=0.0014, interference=term
        ),
    )
    # The units as the pipeline cut them (the order search would join two into another size).
    sched = compile_trace(trace, baselines=False, join_units=False).schedule
    stats, _ = _observe_replay(trace, sched)
    durations = sorted(d for _, d in stats.iterations[0].unit_samples)
    cost_us = trace.comm.cost_us(stats.iterations[0].unit_samples[0][0])
    # The case itself: units of one size, some beside the delay, some alone at the cost.
    assert len({b for b, _ in stats.iterations[0].unit_samples}) == 1
    assert durations[0] == pytest.approx(cost_us)
    assert durations[-1] > 359.0
    est = estimate(trace, stats, running=sched)
    assert est.beta_us_per_byte == pytest.approx(trace.comm.beta_us_per_byte, rel=1e-6)


def test_recompile_compares_with_the_running_schedule() -> None:
    """`pace recompile --schedule CURRENT` (``recompile(current=...)``) passes the running
    schedule on: observing its own replay, it predicts no gain from re-planning."""
    from pace.drift.offline import recompile

    trace, sched = _vgg_with_term()
    stats, iteration_us = _observe_replay(trace, sched)
    got = recompile(trace, stats, current=sched)
    assert got.estimate.backward_scale == pytest.approx(1.0, rel=1e-9)
    assert got.current_us == pytest.approx(iteration_us, rel=1e-6)
    assert got.switch is False


# ---------------------------------------------------------------------------------------------
# warp_backward: the backward in the shape the job measured


def _ready_in_order(trace: Trace) -> list[tuple[str, float]]:
    ready = trace_spans(trace).ready_us
    return sorted(ready.items(), key=lambda kv: kv[1])


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    steps=st.lists(st.floats(0.0, 5.0), min_size=40, max_size=40),
)
def test_warp_puts_each_gradient_where_observed(seed: int, steps: list[float]) -> None:
    """On a trace whose backward is a chain (one op after the other: every real sequential
    model's), each observed gradient is ready exactly when observed; the forward, the
    tensors and the link are the trace's; the map is monotone, so no duration is negative."""
    trace = random_trace(seed=seed, n_layers=8, skip_prob=0.0, ops_per_layer=2)
    order = _ready_in_order(trace)
    observed: dict[str, float] = {}
    t = 0.0
    for (name, ideal), step in zip(order, steps, strict=False):
        # Ties (one op making several tensors) must be observed together on a chain.
        if observed and ideal == order[len(observed) - 1][1]:
            observed[name] = t
            continue
        t += step * max(ideal, 1.0) / len(order) + 1e-3
        observed[name] = t
    warped = warp_backward(trace, observed)
    got = trace_spans(warped).ready_us
    for name, want in observed.items():
        assert got[name] == pytest.approx(want, rel=1e-9, abs=1e-6)
    assert all(op.duration_us >= 0 for op in warped.ops)
    assert [o for o in warped.ops if o.phase != "backward"] == [
        o for o in trace.ops if o.phase != "backward"
    ]
    assert (warped.tensors, warped.comm) == (trace.tensors, trace.comm)


@settings(max_examples=60, deadline=None)
@given(trace=traces(), factor=st.floats(0.1, 10.0))
def test_a_uniform_observation_is_a_phase_scale(trace: Trace, factor: float) -> None:
    """Observed at ``factor`` times the ideal ready times, on any DAG, every backward op takes
    ``factor`` times as long: the per-phase estimate's backward scale, and the warp agrees."""
    observed = {n: factor * t for n, t in trace_spans(trace).ready_us.items()}
    warped = warp_backward(trace, observed)
    for was, now in zip(trace.ops, warped.ops, strict=True):
        scale = factor if was.phase == "backward" else 1.0
        assert now.duration_us == pytest.approx(was.duration_us * scale, rel=1e-9, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(trace=traces(), noise=st.lists(st.floats(0.2, 5.0), min_size=1, max_size=200))
def test_noisy_observations_keep_the_gradients_order(trace: Trace, noise: list[float]) -> None:
    """Observations out of order (noise: a later gradient seen earlier) are fitted monotone
    (isotonic): no duration goes negative and no gradient overtakes one the trace makes first."""
    ideal = trace_spans(trace).ready_us
    observed = {n: t * noise[i % len(noise)] for i, (n, t) in enumerate(ideal.items())}
    warped = warp_backward(trace, observed)
    assert all(op.duration_us >= 0 for op in warped.ops)
    got = trace_spans(warped).ready_us
    by_ideal = sorted(ideal, key=ideal.__getitem__)
    assert all(got[a] <= got[b] + 1e-6 for a, b in itertools.pairwise(by_ideal))


def test_warp_refuses_what_it_cannot_place() -> None:
    trace = random_trace(seed=3)
    name = trace.tensors[0].name
    with pytest.raises(InputError, match="no tensor 'nope'") as unknown:
        warp_backward(trace, {"nope": 1.0})
    assert unknown.value.field == "ready_us['nope']"
    for bad in (-1.0, float("nan"), "1"):
        with pytest.raises(InputError) as err:
            warp_backward(trace, {name: bad})  # type: ignore[dict-item]
        assert err.value.field == f"ready_us[{name!r}]"
    assert warp_backward(trace, {}) is trace


def test_observations_out_of_order_are_pooled_as_the_isotonic_fit_pools_them() -> None:
    """A later gradient observed before an earlier one (noise): the least-squares monotone
    fit puts both at their mean, not the earlier one at its own time and the later one held
    back to it."""
    from tests.test_sim import chain_trace

    trace = chain_trace(
        [(f"b{i}", "backward", 10.0) for i in (3, 2, 1)]
        + [(f"f{i}", "forward", 5.0) for i in (1, 2, 3)],
        [(f"w{i}", 4, f"b{i}", (f"f{i}",)) for i in (3, 2, 1)],
    )
    warped = warp_backward(trace, {"w3": 10.0, "w2": 30.0, "w1": 25.0})
    ready = trace_spans(warped).ready_us
    assert ready["w3"] == pytest.approx(10.0)
    assert ready["w2"] == pytest.approx(27.5)
    assert ready["w1"] == pytest.approx(27.5)
