"""The throttled-link benchmark's handoff fit of the compute loss (bench_netns.fit_compute_loss).

No namespaces here: the "measured" periods are the simulator's own under a known loss, so the
fit must find a loss that predicts them (the periods, not necessarily the same two numbers: a
per-call and a per-byte loss can trade off where every unit has a similar size).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import bench_netns
from pace.compiler import compile_trace
from pace.io import load_trace
from pace.ir import CommModel, Interference, Trace

ROOT = Path(__file__).resolve().parents[1]


def _vgg_on(beta_us_per_byte: float) -> tuple[Trace, Interference, tuple[object, object]]:
    trace = load_trace(ROOT / "traces" / "vgg16.json.gz")
    comm = CommModel(workers=2, alpha_us=500.0, beta_us_per_byte=beta_us_per_byte)
    probe = Interference(us_per_call=500.0, idle_loss=0.05, comm_stretch=0.1, comm_us_per_call=2e3)
    trace = dataclasses.replace(trace, comm=comm)
    with_probe = dataclasses.replace(comm, interference=probe)
    probed = dataclasses.replace(trace, comm=with_probe)
    schedule = compile_trace(probed, baselines=False).schedule
    sync = compile_trace(probed, mode="sync", baselines=False).schedule
    return trace, probe, (schedule, sync)


@pytest.fixture(scope="module")
def vgg() -> tuple[Trace, Interference, tuple[object, object]]:
    # A link on which the gradients take about as long as the compute: the loss decides.
    return _vgg_on(4e-3)


@pytest.fixture(scope="module")
def vgg_slow_link() -> tuple[Trace, Interference, tuple[object, object]]:
    # A link on which vanilla's calls outlast backward (16 s of 528 MiB against 12 s of
    # compute): the wait after backward, which vanilla Horovod's fit is about.
    return _vgg_on(3e-2)


FITTED = ("pace", "online", "pace-sync", "vanilla")
# Vanilla's own calls (DDP's buckets) take their own time beside compute: a channel part of
# their own, which the fit keeps.
VANILLA_CHANNEL = {"comm_stretch": 0.3, "comm_us_per_call": 500.0}


def _as_run(term: Interference, steps_us: dict[str, float]) -> bench_netns.AsRun:
    terms = {"*": term, "vanilla": dataclasses.replace(term, **VANILLA_CHANNEL)}
    return bench_netns.AsRun(terms=terms, steps_us=steps_us)


def _periods(
    trace: Trace, schedules: tuple[object, object], run: bench_netns.AsRun
) -> dict[str, list[float]]:
    """What a run as ``run`` describes measures: the simulator's periods, in seconds."""
    idle_free = {k: dataclasses.replace(t, idle_loss=0.0) for k, t in run.terms.items()}
    as_run = dataclasses.replace(run, terms=idle_free)
    sims = bench_netns.simulate_variants(trace, *schedules, "torch", as_run=as_run)
    return {k: [sims[k][0] / 1e3] * 3 for k in (*FITTED, "local")}


def _misses(
    trace: Trace, schedules: tuple[object, object], run: bench_netns.AsRun, periods: dict
) -> np.ndarray:
    pred = bench_netns.launch_calibrated_ms(
        trace, *schedules, "torch", as_run=run, measured=periods
    )
    return np.array([pred[v] / (periods[v][0] * 1e3) - 1 for v in FITTED])


@settings(max_examples=6, deadline=None)
@given(
    per_call_ms=st.floats(0.0, 20.0),
    per_mib_ms=st.floats(0.0, 3.0),
    sync_step_ms=st.floats(0.0, 500.0),
)
def test_the_fitted_loss_predicts_the_periods_it_was_fitted_on(
    vgg: tuple[Trace, Interference, tuple[object, object]],
    per_call_ms: float,
    per_mib_ms: float,
    sync_step_ms: float,
) -> None:
    trace, probe, schedules = vgg
    truth = dataclasses.replace(
        probe, us_per_call=per_call_ms * 1e3, us_per_byte=per_mib_ms * 1e3 / 2**20
    )
    # The sync mode's step as the launch measured it: the fit takes it as given.
    steps_us = {"pace-sync": sync_step_ms * 1e3}
    periods = _periods(trace, schedules, _as_run(truth, steps_us))
    start = _as_run(probe, steps_us)
    fitted = bench_netns.fit_compute_loss(trace, schedules, "torch", start, periods)
    # Only the compute part moves, the same for every variant; each keeps its channel part,
    # and the idle loss stays the probe's; the measured steps stay.
    assert fitted.steps_us == steps_us
    assert (fitted.terms["*"].comm_stretch, fitted.terms["*"].comm_us_per_call) == (0.1, 2e3)
    vanilla = fitted.terms["vanilla"]
    assert (vanilla.comm_stretch, vanilla.comm_us_per_call) == (0.3, 500.0)
    loss = {(t.us_per_call, t.us_per_byte) for t in fitted.terms.values()}
    assert len(loss) == 1
    assert min(next(iter(loss))) >= 0
    assert {t.idle_loss for t in fitted.terms.values()} == {probe.idle_loss}
    misses = _misses(trace, schedules, fitted, periods)
    assert np.max(np.abs(misses)) < 0.01, misses
    before = _misses(trace, schedules, start, periods)
    assert np.sum(misses**2) <= np.sum(before**2) + 1e-12


@settings(max_examples=20, deadline=None)
@given(local_ms=st.floats(1.0, 1e5))
def test_in_job_gives_the_compiler_the_compute_the_job_measured(
    vgg: tuple[Trace, Interference, tuple[object, object]], local_ms: float
) -> None:
    trace, _, _ = vgg
    scaled = bench_netns.in_job(trace, local_ms)
    assert bench_netns._compute_us(scaled) == pytest.approx(local_ms * 1e3, rel=1e-9)
    # Ops and step by the same factor: the step's share of an iteration is the profile's.
    share = trace.meta["optimizer_us"] / bench_netns._compute_us(trace)
    assert scaled.meta["optimizer_us"] / (local_ms * 1e3) == pytest.approx(share, rel=1e-9)
    assert scaled.comm == trace.comm


@settings(max_examples=30, deadline=None)
@given(periods=st.lists(st.floats(0.1, 2.0), min_size=3, max_size=40))
def test_the_median_interval_holds_the_median(periods: list[float]) -> None:
    ci = bench_netns.median_ci_ms(periods)
    assert ci is not None
    median_ms = float(np.median(periods)) * 1e3
    assert ci[0] <= median_ms + 1e-9
    assert median_ms <= ci[1] + 1e-9
    assert min(periods) * 1e3 - 1e-9 <= ci[0]
    assert ci[1] <= max(periods) * 1e3 + 1e-9
    row = bench_netns.Row(
        rate="1gbit",
        backend="torch",
        variant="pace",
        measured_ms=median_ms,
        spread_ms=0.0,
        predicted_ms=None,
        independent_ms=None,
        median_ci_ms=ci,
    )
    # A prediction is within the noise inside the interval or within 5%, and not beyond both.
    assert bench_netns.within_noise(ci[0], row)
    assert bench_netns.within_noise(median_ms * 1.049, row)
    beyond = max(ci[1], median_ms * 1.05) * 1.01
    assert not bench_netns.within_noise(beyond, row)
    assert not bench_netns.within_noise(None, row)


def test_too_few_periods_have_no_interval() -> None:
    assert bench_netns.median_ci_ms([0.5, 0.6]) is None


@settings(max_examples=5, deadline=None)
@given(extra_step_ms=st.floats(1.0, 500.0))
def test_the_step_counts_only_where_the_training_thread_runs_it(
    vgg: tuple[Trace, Interference, tuple[object, object]], extra_step_ms: float
) -> None:
    """The overlapped modes update on the runtime's thread as units complete (their step()
    returns at once); DDP's, the sync mode's and `local`'s step runs after backward."""
    trace, probe, schedules = vgg
    slower = dataclasses.replace(
        trace, meta={**trace.meta, "optimizer_us": trace.meta["optimizer_us"] + extra_step_ms * 1e3}
    )
    as_run = bench_netns.AsRun(terms={"*": probe})
    before, after = (
        bench_netns.predictions_ms(t, *schedules, "torch", as_run=as_run) for t in (trace, slower)
    )
    slow = 1.0 / (1.0 - probe.idle_loss)
    for variant, grows in (("pace", 0), ("online", 0), ("pace-sync", 1), ("vanilla", 1)):
        assert after[variant] - before[variant] == pytest.approx(grows * extra_step_ms * slow)
    assert after["local"] - before["local"] == pytest.approx(extra_step_ms * slow)


@settings(max_examples=5, deadline=None)
@given(step_ms=st.floats(0.0, 500.0))
def test_a_measured_step_replaces_the_profiles_for_its_variant_alone(
    vgg: tuple[Trace, Interference, tuple[object, object]], step_ms: float
) -> None:
    """The sync mode's and DDP's step as a launch measured it; a measured step for an
    overlapped mode changes nothing (its training thread does not run one)."""
    trace, probe, schedules = vgg
    profiled = bench_netns.AsRun(terms={"*": probe})
    measured = dataclasses.replace(
        profiled, steps_us={"pace-sync": step_ms * 1e3, "pace": step_ms * 1e3}
    )
    before, after = (
        bench_netns.predictions_ms(trace, *schedules, "torch", as_run=r)
        for r in (profiled, measured)
    )
    profile_step_ms = trace.meta["optimizer_us"] / 1e3 / (1.0 - probe.idle_loss)
    assert after["pace-sync"] - before["pace-sync"] == pytest.approx(step_ms - profile_step_ms)
    assert {k: v for k, v in after.items() if k != "pace-sync"} == {
        k: v for k, v in before.items() if k != "pace-sync"
    }
    assert bench_netns.step_measured("torch") == {"pace-sync", "vanilla"}
    assert bench_netns.step_measured("horovod") == {"pace-sync"}


@settings(max_examples=4, deadline=None)
@given(
    per_call_ms=st.floats(0.0, 20.0),
    per_mib_ms=st.floats(0.0, 3.0),
    vanilla_scale=st.floats(0.7, 2.5),
)
def test_with_horovod_vanilla_loses_no_compute_and_gets_its_calls_cost_fitted(
    vgg_slow_link: tuple[Trace, Interference, tuple[object, object]],
    per_call_ms: float,
    per_mib_ms: float,
    vanilla_scale: float,
) -> None:
    """Vanilla Horovod's compute runs as fast as `local@vanilla`'s; what it misses is its fused
    calls' cost. The runtime's variants share the fitted compute loss, vanilla's compute loses
    nothing (its probe's channel part stays), and its calls' per-byte cost is what is fitted to
    its period."""
    trace, probe, schedules = vgg_slow_link
    vanilla_probe = dataclasses.replace(probe, **VANILLA_CHANNEL)
    vanilla_truth = dataclasses.replace(vanilla_probe, us_per_call=0.0, us_per_byte=0.0)
    runtime_truth = dataclasses.replace(
        probe, us_per_call=per_call_ms * 1e3, us_per_byte=per_mib_ms * 1e3 / 2**20, idle_loss=0.0
    )
    fused = dataclasses.replace(
        trace.comm, beta_us_per_byte=trace.comm.beta_us_per_byte * vanilla_scale
    )
    truth = bench_netns.AsRun(
        terms={"*": runtime_truth, "vanilla": dataclasses.replace(vanilla_truth, idle_loss=0.0)},
        comms={"vanilla": fused},
    )
    sims = bench_netns.simulate_variants(trace, *schedules, "horovod", as_run=truth)
    periods = {k: [sims[k][0] / 1e3] * 3 for k in (*FITTED, "local", "local@vanilla")}
    base = bench_netns.AsRun(terms={"*": probe, "vanilla": vanilla_probe})
    cal = bench_netns.fit_calibration(trace, schedules, "horovod", base, periods)
    terms = cal.as_run.terms
    assert terms["vanilla"] == vanilla_truth
    runtime = {terms[v] for v in bench_netns.RUNTIME_VARIANTS}
    assert len(runtime) == 1
    (fitted,) = runtime
    assert (fitted.comm_stretch, fitted.comm_us_per_call) == (0.1, 2e3)
    comm = cal.as_run.comms["vanilla"]
    assert comm.alpha_us == trace.comm.alpha_us
    # The period rises with the per-byte cost where the calls outlast backward: one scale.
    assert comm.beta_us_per_byte / trace.comm.beta_us_per_byte == pytest.approx(
        vanilla_scale, rel=0.02
    )
    pred = bench_netns.launch_calibrated_ms(
        trace, *schedules, "horovod", as_run=cal.as_run, measured=periods
    )
    misses = np.array([pred[v] / (periods[v][0] * 1e3) - 1 for v in FITTED])
    assert np.max(np.abs(misses)) < 0.01, misses


@settings(max_examples=50, deadline=None)
@given(data=st.data(), n=st.integers(1, 20), ranks=st.integers(2, 4))
def test_local_is_the_slower_rank_per_iteration_and_the_rest_rank_0s(
    data: st.DataObject, n: int, ranks: int
) -> None:
    series = st.lists(st.floats(0.1, 2.0), min_size=n, max_size=n)
    per_rank = [
        {"local": data.draw(series), "local@vanilla": data.draw(series), "pace": data.draw(series)}
        for _ in range(ranks)
    ]
    slower = bench_netns.slower_rank(per_rank)
    assert set(slower) == {"local", "local@vanilla"}  # the communicating variants are rank 0's
    for k, periods in slower.items():
        for i, p in enumerate(periods):
            assert p == max(r[k][i] for r in per_rank)
    # Where rank 0 was the slower in every iteration, nothing changes.
    half = {k: [0.5 * p for p in v] for k, v in per_rank[0].items()}
    faster = [per_rank[0], *[half] * (ranks - 1)]
    assert all(faster[0][k] == v for k, v in bench_netns.slower_rank(faster).items())


def test_ranks_with_different_numbers_of_periods_are_refused() -> None:
    with pytest.raises(ValueError, match="different numbers of `local` periods"):
        bench_netns.slower_rank([{"local": [0.3, 0.3]}, {"local": [0.3]}])


def test_a_launch_is_read_with_local_from_the_slower_rank(tmp_path: Path) -> None:
    import json

    out = tmp_path / "train.json"
    rank0 = {"pace": [0.5, 0.6], "local": [0.30, 0.40]}
    rank1 = {"pace": [0.9, 0.9], "local": [0.35, 0.20]}
    for r, periods in enumerate((rank0, rank1)):
        Path(f"{out}.rank{r}").write_text(json.dumps(periods))
    assert bench_netns.read_launch(out) == {"pace": [0.5, 0.6], "local": [0.35, 0.40]}


def test_the_repeat_is_the_calibration_launchs_median_of_the_same_program(
    vgg_slow_link: tuple[Trace, Interference, tuple[object, object]],
) -> None:
    # Two different programs (on the slow link the sync mode compiles to fewer units).
    _, _, (schedule, sync) = vgg_slow_link
    assert bench_netns._program(schedule) != bench_netns._program(sync)
    periods = {"pace": [0.4, 0.5, 0.6], "pace-sync": [0.7, 0.7, 0.8], "vanilla": [0.9]}
    periods["local"] = [0.3, 0.3]
    cal = bench_netns.Calibration(bench_netns.AsRun(), periods, schedules=(schedule, sync))
    same = bench_netns.repeat_ms(cal, {"pace": schedule, "pace-sync": sync})
    # The calibration's schedules trained again (`pace@cal`) repeat its own medians.
    again = {"pace@cal": 500.0, "pace-sync@cal": 700.0}
    assert same == pytest.approx(
        {"pace": 500.0, "pace-sync": 700.0, "vanilla": 900.0, "local": 300.0} | again
    )
    # Compiled again to other units, the timed launch ran another program: no repeat for it.
    assert set(bench_netns.repeat_ms(cal, {"pace": sync, "pace-sync": sync})) == {
        "pace-sync",
        "vanilla",
        "local",
        *again,
    }
    # Compiled again to Horovod's own path, it trains vanilla's program: vanilla's median.
    on_path = dataclasses.replace(sync, framework="horovod")  # type: ignore[type-var]
    moved = bench_netns.repeat_ms(cal, {"pace": on_path, "pace-sync": sync})
    assert moved["pace"] == pytest.approx(900.0)
    assert moved["pace-sync"] == pytest.approx(700.0)
    # ... and where the calibration trained no vanilla, nothing stands for it.
    alone = bench_netns.Calibration(
        bench_netns.AsRun(),
        {k: v for k, v in periods.items() if k != "vanilla"},
        schedules=(schedule, sync),
    )
    assert "pace" not in bench_netns.repeat_ms(alone, {"pace": on_path, "pace-sync": sync})
    # ... and the calibration's schedule is trained again, under its own name.
    assert bench_netns.again_schedules(cal, {"pace": sync, "pace-sync": sync}) == {
        "pace@cal": schedule
    }
    assert bench_netns.again_schedules(cal, {"pace": schedule, "pace-sync": sync}) == {}
    assert bench_netns.as_again({"pace": 1.0, "pace-sync": 2.0, "online": 3.0}, again) == {
        "pace@cal": 1.0,
        "pace-sync@cal": 2.0,
    }

    # A prediction of both programs: the compiled schedules' under their own names, the
    # calibration's under the names that train them again.
    def fn(first: object, second: object) -> dict[str, object]:
        return {"pace": first, "pace-sync": second, "vanilla": None}

    both = bench_netns.of_programs(fn, (sync, sync), cal, {"pace@cal": schedule})
    assert both == {"pace": sync, "pace-sync": sync, "vanilla": None, "pace@cal": schedule}
    assert bench_netns.of_programs(fn, (sync, sync), cal, {}) == fn(sync, sync)
    # Another schedule of the replay's mode (pace-nojoin): `pace`'s result with it.
    other = bench_netns.of_programs(fn, (sync, sync), cal, {}, {"pace-nojoin": schedule})
    assert other == {"pace": sync, "pace-sync": sync, "vanilla": None, "pace-nojoin": schedule}
    # Its priorities renumbered in the same order, it is the same program.
    units = tuple(dataclasses.replace(u, priority=2.0 * u.priority + 1.0) for u in schedule.units)  # type: ignore[attr-defined]
    renumbered = dataclasses.replace(schedule, units=units)  # type: ignore[type-var]
    assert "pace" in bench_netns.repeat_ms(cal, {"pace": renumbered, "pace-sync": sync})


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.integers(1, 12), ranks=st.integers(2, 4))
def test_a_units_channel_time_starts_when_the_last_rank_could_start_it(
    data: st.DataObject, n: int, ranks: int
) -> None:
    # Per unit: when the channel could start it on each rank (its issue there), how long it
    # then holds the channel, and how late each rank sees it done (its completion thread).
    ms = st.floats(0.0, 50.0)
    sizes = data.draw(st.lists(st.integers(1, 2**26), min_size=n, max_size=n))
    channel_s = [data.draw(st.floats(1e-4, 0.2)) for _ in range(n)]
    per_rank: list[list[tuple[int, float, float]]] = [[] for _ in range(ranks)]
    at_s = 1000.0
    for size, hold_s in zip(sizes, channel_s, strict=True):
        starts = [at_s + data.draw(ms) / 1e3 for _ in range(ranks)]
        end_s = max(starts) + hold_s
        for r in range(ranks):
            seen_s = end_s + (data.draw(ms) / 1e3 if r else 0.0)
            per_rank[r].append((size, (seen_s - starts[r]) * 1e6, seen_s))
        at_s = end_s + 0.01
    merged = bench_netns.merged_units(per_rank)
    assert [b for b, _ in merged] == sizes
    last_seen_s = [max(per_rank[r][i][2] for r in range(ranks)) for i in range(n)]
    for i, (_, us) in enumerate(merged):
        # The channel's own time, plus how much later than rank 0 the last rank saw it done.
        assert us == pytest.approx((channel_s[i] + last_seen_s[i] - per_rank[0][i][2]) * 1e6)
        # Never more than the own log of the rank that saw it done last.
        last = max(range(ranks), key=lambda r: per_rank[r][i][2])
        assert us <= per_rank[last][i][1] + 1e-3
    # Where every rank starts and finishes each unit together, it is each rank's own log.
    same = [per_rank[0]] * ranks
    alone = bench_netns.merged_units(same)
    assert [b for b, _ in alone] == sizes
    assert [us for _, us in alone] == pytest.approx([us for _, us, _ in per_rank[0]])


def test_unit_logs_that_do_not_line_up_are_refused(tmp_path: Path) -> None:
    import json

    with pytest.raises(ValueError, match="different numbers of units"):
        bench_netns.merged_units([[(8, 10.0, 1.0)], []])
    with pytest.raises(ValueError, match="different sizes"):
        bench_netns.merged_units([[(8, 10.0, 1.0)], [(16, 10.0, 1.0)]])
    # Read from every rank's file; a variant that logged none has no units.
    out = tmp_path / "train.json.pace.units"
    assert bench_netns.read_unit_logs(out) is None
    logs = [[[8, 3000.0, 2.0]], [[8, 1000.0, 2.0]]]  # rank 1 issued 2 ms after rank 0
    for r, log in enumerate(logs):
        Path(f"{out}.rank{r}").write_text(json.dumps(log))
    assert bench_netns.read_unit_logs(out) == logs
    ((size, us),) = bench_netns.merged_units(logs)
    assert (size, us) == (8, pytest.approx(1000.0))


def test_the_runtimes_replay_is_predicted_as_the_runtime_issues_its_units() -> None:
    from pace.sim import schedule_policy, simulate
    from tests.test_issue_order import late_first

    # The unit listed first is ready late: the contract's replay (the ready unit with the
    # smallest priority) sends the other one first, the runtime (strictly in priority
    # order) waits for it. The prediction of the runtime's modes is the runtime's.
    trace, schedule = late_first()
    strict = simulate(trace, schedule_policy(schedule, in_order=True)).iteration_us / 1e3
    contract = simulate(trace, schedule_policy(schedule)).iteration_us / 1e3
    assert strict > contract
    predicted = bench_netns.simulate_variants(trace, schedule, schedule, "torch")["pace"][0]
    assert predicted == pytest.approx(strict)


def test_the_sync_forward_over_locals_is_charged_to_the_sync_mode_alone(
    vgg: tuple[Trace, Interference, tuple[object, object]],
) -> None:
    trace, probe, schedules = vgg
    # Rank 0's phase medians (forward, backward, step; ms) as a launch wrote them.
    phases = {
        "local": (140.0, 300.0, 20.0),
        "pace-sync": (159.0, 600.0, 30.0),
        "pace": (400.0, 300.0, 0.1),
        "vanilla": (150.0, 300.0, 300.0),
    }
    assert bench_netns.forwards_over_local_us(phases, "torch") == {}
    over = bench_netns.forwards_over_local_us(phases, "horovod")
    assert over == pytest.approx({"pace-sync": 19e3})
    faster = {**phases, "pace-sync": (131.0, 600.0, 30.0)}  # the spread: kept, not clipped
    assert bench_netns.forwards_over_local_us(faster, "horovod") == pytest.approx(
        {"pace-sync": -9e3}
    )
    plain = _as_run(probe, {})
    base = bench_netns.simulate_variants(trace, *schedules, "horovod", as_run=plain)
    run = dataclasses.replace(plain, forwards_over_us=over)
    charged = bench_netns.simulate_variants(trace, *schedules, "horovod", as_run=run)
    assert charged["pace-sync"][0] == pytest.approx(base["pace-sync"][0] + 19.0)
    assert charged["pace-sync"][1] == base["pace-sync"][1]  # the channel is the replay's
    assert {k: v for k, v in charged.items() if k != "pace-sync"} == {
        k: v for k, v in base.items() if k != "pace-sync"
    }
    # The calibration's fit of the compute loss takes it as given, as the measured steps.
    periods = _periods(trace, schedules, run)
    fitted = bench_netns.fit_compute_loss(trace, schedules, "torch", run, periods)
    assert fitted.forwards_over_us == over


@settings(max_examples=60, deadline=None)
@given(data=st.data(), blocks=st.integers(1, 3), per_block=st.integers(3, 7))
def test_the_measured_idle_is_the_gaps_of_the_timeline_the_logs_describe(
    data: st.DataObject, blocks: int, per_block: int
) -> None:
    """A known timeline of two ranks (rank 0 sees every unit done last and ends its forward
    last, rank 1 starts every unit last): the gaps the logs give back are the ones it was built
    with, over the iterations with one before and one after them in their block; with the
    gradients' times, so is the head's split on the rank that issued the first unit last."""
    gap_ms = st.floats(0.0, 50.0)
    fraction = st.floats(0.0, 1.0)
    per_rank: list[list[tuple[int, float, float]]] = [[], []]
    marks: list[list[tuple[float, float, float]]] = [[], []]
    grads: list[list[float]] = [[], []]
    tails, heads, withins, splits = [], [], [], []
    aheads: list[float | None] = []
    t_s = 100.0
    for _ in range(blocks):
        last_end_s = t_s
        for pos in range(per_block):
            tail, head = data.draw(gap_ms) / 1e3, data.draw(st.floats(1.0, 50.0)) / 1e3
            forward_end_s = last_end_s + tail
            # Rank 1's forward ends earlier, after its gradients of the iteration before.
            lag_s = data.draw(st.floats(0.0, 0.4)) / 1e3
            forward_ends = (forward_end_s, forward_end_s - lag_s)
            for r in range(2):
                marks[r].append((forward_end_s - 0.1, forward_ends[r], forward_end_s + 0.2))
            start_s, within = forward_end_s + head, 0.0
            # Rank 0 issued the first unit before rank 1 (never before its forward ended),
            # each once its last gradient for it was ready; one more comes before (the forward's
            # end) and one after (inside the unit's 1 ms or more).
            issued = (start_s - (0.1 + 0.9 * data.draw(fraction)) * head, start_s)
            for r in range(2):
                ready_s = forward_ends[r] + data.draw(fraction) * (issued[r] - forward_ends[r])
                grads[r] += [forward_ends[r] - 1e-6, ready_s, issued[r] + 5e-4]
            last = max(range(2), key=issued.__getitem__)
            ready_last = grads[last][-2]
            # The other rank to as many gradients (the one ready strictly after the forward's
            # end, where the rank the channel waited for had one) after its own forward's end.
            first = 1 - last
            own = [g for g in grads[first][-3:] if g > forward_ends[first]]
            aheads.append(own[0] - forward_ends[first] if ready_last > forward_ends[last] else None)
            splits.append(
                (
                    ready_last - forward_ends[last],
                    issued[last] - ready_last,
                    issued[last] - min(issued),
                )
            )
            for k in range(data.draw(st.integers(1, 4))):
                if k:
                    gap_s = data.draw(gap_ms) / 1e3
                    start_s, within = start_s + gap_s, within + gap_s
                end_s = start_s + data.draw(st.floats(1.0, 100.0)) / 1e3
                own_start_s = issued[0] if k == 0 else start_s - data.draw(fraction) / 1e3
                per_rank[0].append((8, (end_s - own_start_s) * 1e6, end_s))
                seen_s = end_s - data.draw(st.floats(0.0, 1.0)) / 1e3
                per_rank[1].append((8, (seen_s - start_s) * 1e6, seen_s))
                start_s = last_end_s = end_s
            if 1 <= pos <= per_block - 2:
                tails.append(tail)
                heads.append(head)
                withins.append(within)
            else:
                splits.pop()
                aheads.pop()
        t_s = last_end_s + 10.0  # other variants' blocks in between
    assert bench_netns.measured_idle(per_rank, marks, per_block).head_backward_ms is None
    got = bench_netns.measured_idle(per_rank, marks, per_block, [sorted(g) for g in grads])
    assert got is not None
    assert got.tail_ms == pytest.approx(np.median(tails) * 1e3, abs=1e-6)
    assert got.head_ms == pytest.approx(np.median(heads) * 1e3, abs=1e-6)
    assert got.within_ms == pytest.approx(np.median(withins) * 1e3, abs=1e-6)
    backward, dispatch, skew = (np.median(x) * 1e3 for x in zip(*splits, strict=True))
    assert got.head_backward_ms == pytest.approx(backward, abs=1e-6)
    assert got.head_dispatch_ms == pytest.approx(dispatch, abs=1e-6)
    assert got.head_skew_ms == pytest.approx(skew, abs=1e-6)
    counted = [a for a in aheads if a is not None]
    if counted:
        assert got.head_ahead_ms == pytest.approx(np.median(counted) * 1e3, abs=1e-6)
    else:
        assert got.head_ahead_ms is None


def test_the_head_counts_the_gradients_before_the_issue() -> None:
    """One rank per iteration issues the first unit after two of its gradients (the others
    come after the issue); the count is that rank's, not the other's."""
    per_block = 3
    per_rank: list[list[tuple[int, float, float]]] = [[], []]
    marks: list[list[tuple[float, float, float]]] = [[], []]
    grads: list[list[float]] = [[], []]
    for it in range(per_block):
        f = 10.0 * it + 1.0  # forward end; the unit is issued 0.5 s later on rank 1, 0.3 on rank 0
        for r, (issue, before) in enumerate([(f + 0.3, 1), (f + 0.5, 2)]):
            marks[r].append((f - 1.0, f, f + 2.0))
            grads[r] += [f + 0.1 * (k + 1) for k in range(before)] + [issue + 0.01, issue + 0.02]
            per_rank[r].append((8, 0.1e6, issue + 0.1))  # its unit, done 0.1 s after its issue
    got = bench_netns.measured_idle(per_rank, marks, per_block, [sorted(g) for g in grads])
    assert got is not None
    assert got.head_gradients == 2


def test_local_backward_is_the_slower_ranks_time_to_as_many_gradients() -> None:
    per_block = 4  # iterations 1 and 2 of each block count
    marks: list[list[tuple[float, float, float]]] = [[], []]
    grads: list[list[float]] = [[], []]
    want, want_faster = [], []
    for it in range(2 * per_block):
        f = 10.0 * it + 1.0
        offsets = [[0.1, 0.2 + it / 100, 0.5], [0.15, 0.25, 0.6]]  # rank 0 slower from it 5 on
        for r in range(2):
            marks[r].append((f - 1.0, f, f + 1.0))
            grads[r] += [f + x for x in offsets[r]]
        if 1 <= it % per_block <= 2:
            want.append(max(offsets[0][1], offsets[1][1]))
            want_faster.append(min(offsets[0][1], offsets[1][1]))
    got = bench_netns.local_backward_ms(marks, grads, per_block, 2)
    assert got == pytest.approx(np.median(want) * 1e3)
    faster = bench_netns.local_backward_ms(marks, grads, per_block, 2, slower=False)
    assert faster == pytest.approx(np.median(want_faster) * 1e3)
    assert bench_netns.local_backward_ms(marks, grads, per_block, 3) == pytest.approx(600.0)
    # More gradients than a backward marks, or none: nothing to compare.
    assert bench_netns.local_backward_ms(marks, grads, per_block, 4) is None
    assert bench_netns.local_backward_ms(marks, grads, per_block, 0) is None
    # Every count at once, each gradient the later rank's: the curve ``reshaped`` takes.
    curve = bench_netns.local_ready_ms(marks, grads, per_block, 3)
    assert curve == pytest.approx([150.0, got, 600.0])


@settings(max_examples=20, deadline=None)
@given(
    local_ms=st.floats(50.0, 1e4),
    share=st.floats(0.3, 0.8),
    bends=st.lists(st.floats(0.2, 5.0), min_size=1, max_size=6),
)
def test_the_job_shaped_trace_has_the_jobs_gradient_times(
    vgg: tuple[Trace, Interference, tuple[object, object]],
    local_ms: float,
    share: float,
    bends: list[float],
) -> None:
    """Scaled to the `local` it was shaped on, the trace computes for as long as `local` did
    and marks its k-th gradient when `local` marked its k-th: the backward bent anywhere,
    its share of `local` anything; the forward and the step share the rest in the profile's
    proportion. Shaped on a curve that cannot be placed, it stays the profile's."""
    from pace.drift.estimate import trace_spans

    trace, _, _ = vgg
    ideal = sorted(trace_spans(trace).ready_us.values())
    # A monotone curve through the trace's own ready times, bent per stretch of gradients.
    ready, t, last = [], 0.0, 0.0
    for k, x in enumerate(ideal):
        t += (x - last) * bends[k * len(bends) // len(ideal)]
        ready.append(t)
        last = x
    ready = [r * share * local_ms / ready[-1] for r in ready]
    shaped = bench_netns.reshaped(trace, local_ms, ready)
    assert bench_netns._compute_us(shaped) == pytest.approx(bench_netns._compute_us(trace))
    in_job = bench_netns.in_job(shaped, local_ms)
    assert bench_netns._compute_us(in_job) == pytest.approx(local_ms * 1e3, rel=1e-6)
    got = sorted(trace_spans(in_job).ready_us.values())
    assert got == pytest.approx([r * 1e3 for r in ready], rel=1e-6, abs=1e-3)
    assert shaped.tensors == trace.tensors
    assert shaped.comm == trace.comm
    # The forward and the step: one factor between them, as in the profile.
    fw = sum(o.duration_us for o in in_job.ops if o.phase == "forward")
    fw0 = sum(o.duration_us for o in trace.ops if o.phase == "forward")
    assert in_job.meta["optimizer_us"] / fw == pytest.approx(trace.meta["optimizer_us"] / fw0)
    assert bench_netns.reshaped(trace, local_ms, ready[:-1]) is trace
    assert bench_netns.reshaped(trace, ready[-1] / 2, ready) is trace  # backward over `local`


def test_marks_that_are_not_whole_blocks_are_refused() -> None:
    marks = [[(0.0, 1.0, 2.0)] * 5, [(0.0, 1.0, 2.0)] * 5]
    with pytest.raises(ValueError, match="whole blocks of 3"):
        bench_netns.measured_idle([[], []], marks, 3)
    with pytest.raises(ValueError, match="whole blocks"):
        bench_netns.measured_idle([[], []], [marks[0], marks[0][:3]], 3)


def test_the_replays_idle_and_busy_channel_make_its_period(
    vgg: tuple[Trace, Interference, tuple[object, object]],
) -> None:
    trace, probe, schedules = vgg
    sims = bench_netns.simulate_variants(trace, *schedules, "torch", as_run=_as_run(probe, {}))
    for variant in ("pace", "online"):
        p = sims[variant]
        assert p.idle is not None
        parts = (p.idle.tail_ms, p.idle.head_ms, p.idle.within_ms)
        assert min(parts) >= 0.0
        assert sum(parts) + p.channel_ms == pytest.approx(p.period_ms)
    # Where the training thread runs the step (and for no channel at all) there is none.
    assert sims["pace-sync"].idle is None
    assert sims["vanilla"].idle is None
    assert sims["local"].idle is None


def _write_logs(out: Path, variant: str, units: list[tuple[int, float]]) -> None:
    import json

    log = [[size, us, 1.0 + i] for i, (size, us) in enumerate(units)]
    for r in range(2):
        Path(f"{out}.{variant}.units.rank{r}").write_text(json.dumps(log))


def test_each_mode_weighs_alike_in_the_fit_of_the_runtimes_units(tmp_path: Path) -> None:
    """The online mode's many small units must not outvote the replay's few large ones: twice
    as many of them (the same sizes and times) leave the fit as it was, and the replay's units
    come out nearer their own time than with every unit weighing alike."""
    comm = CommModel(workers=2, alpha_us=500.0, beta_us_per_byte=1.6e-2)
    term = Interference(us_per_call=0.0, idle_loss=0.0, comm_stretch=0.0, comm_us_per_call=0.0)
    mib = 2**20
    # Beyond the cost model: the online mode's 2 ms + 0.1 ms per MiB, the replay's 6.8 ms.
    online = [(s * mib // 4, comm.cost_us(s * mib // 4) + 2e3 + 25.0 * s) for s in range(1, 17)]
    replay = [(s * mib // 4, comm.cost_us(s * mib // 4) + 6.8e3) for s in (32, 34, 36)]

    def fitted(online_units: list[tuple[int, float]], out: Path) -> Interference:
        _write_logs(out, "pace", replay)
        _write_logs(out, "online", online_units)
        _write_logs(out, "pace-sync", replay)
        fitted_comm, fitted_term = bench_netns._fit_channel(out, comm, term, units_per_iteration=3)
        assert fitted_comm == comm  # the units took more than the probe's alpha: kept
        return fitted_term

    once = fitted(online, tmp_path / "once")
    twice = fitted(online * 2, tmp_path / "twice")
    assert twice.comm_stretch == pytest.approx(once.comm_stretch, rel=1e-6, abs=1e-9)
    assert twice.comm_us_per_call == pytest.approx(once.comm_us_per_call, rel=1e-6, abs=1e-3)

    def beyond_us(t: Interference, size: int) -> float:
        return t.comm_stretch * comm.cost_us(size) + t.comm_us_per_call

    size = replay[1][0]
    by_unit = np.polyfit(
        [s for s, _ in online + replay],
        [us - comm.cost_us(s) for s, us in online + replay],
        1,
    )
    assert abs(beyond_us(once, size) - 6.8e3) < abs(np.polyval(by_unit, size) - 6.8e3)


def test_units_faster_than_the_probes_alpha_lower_it(tmp_path: Path) -> None:
    """Where the probe's small calls were slow (its alpha 10 ms) and the launch's units took
    4 ms each over their bytes' time, the fit lowers alpha to what they took (no per-call
    delay on top), and the cost model then predicts the units' time."""
    comm = CommModel(workers=2, alpha_us=10e3, beta_us_per_byte=8e-3)
    term = Interference()
    mib = 2**20
    took_us = 4e3  # per unit, beyond its bytes

    def units(sizes: range) -> list[tuple[int, float]]:
        return [(s * mib // 4, took_us + comm.beta_us_per_byte * (s * mib // 4)) for s in sizes]

    _write_logs(tmp_path / "l", "pace", units(range(30, 36)))
    _write_logs(tmp_path / "l", "online", units(range(1, 17)))
    _write_logs(tmp_path / "l", "pace-sync", units(range(30, 36)))
    got_comm, got_term = bench_netns._fit_channel(tmp_path / "l", comm, term, units_per_iteration=6)
    assert got_comm.alpha_us == pytest.approx(took_us, rel=1e-3)
    assert got_comm.beta_us_per_byte == comm.beta_us_per_byte
    assert got_term.comm_us_per_call == pytest.approx(0.0, abs=1.0)
    assert got_term.comm_stretch == pytest.approx(0.0, abs=1e-4)


@settings(max_examples=200, deadline=None)
@given(
    alpha=st.floats(0.0, 2e4),
    stretch=st.floats(0.0, 1.0),
    c0_frac=st.floats(-1.0, 3.0),
    beta=st.floats(1e-4, 1e-1),
    size=st.integers(0, 64 * 2**20),
)
def test_the_intercept_split_reproduces_the_fitted_excess(
    alpha: float, stretch: float, c0_frac: float, beta: float, size: int
) -> None:
    """Whatever the intercept (down to -alpha), the delay and alpha it is split into give a
    call beside compute exactly the fitted excess over the probe's cost, never a negative
    delay or alpha, and never raise alpha."""
    c0 = c0_frac * alpha
    delay, new_alpha = bench_netns.split_intercept(c0, stretch, alpha)
    assert delay >= 0.0
    assert 0.0 <= new_alpha <= alpha
    beside = (1.0 + stretch) * (new_alpha + beta * size) + delay
    excess = c0 + stretch * beta * size
    assert beside - (alpha + beta * size) == pytest.approx(excess, rel=1e-9, abs=1e-6)


def test_the_hedge_model_swaps_in_the_probes_loss_alone() -> None:
    """The other model the compiler hedges over keeps the calibration's channel part (its
    units were measured) and takes the probe's compute loss (the fitted one is the guess)."""
    trace = load_trace(ROOT / "traces" / "vgg16.json.gz")
    fitted = Interference(us_per_call=340.0, us_per_byte=4.3e-3, comm_stretch=0.05)
    fitted = dataclasses.replace(fitted, comm_us_per_call=3.9e3)
    comm = CommModel(workers=2, alpha_us=1e3, beta_us_per_byte=4e-3, interference=fitted)
    compiled = dataclasses.replace(trace, comm=comm)
    probe = Interference(us_per_call=590.0, us_per_byte=1.8e-3, comm_stretch=0.09, idle_loss=0.1)
    alt = bench_netns.probe_loss(compiled, probe)
    assert alt.ops == compiled.ops
    assert alt.tensors == compiled.tensors
    got = alt.comm.interference
    assert (got.us_per_call, got.us_per_byte) == (590.0, 1.8e-3)
    assert got == dataclasses.replace(fitted, us_per_call=590.0, us_per_byte=1.8e-3)
    assert dataclasses.replace(alt.comm, interference=None) == dataclasses.replace(
        comm, interference=None
    )


def test_the_compilers_framework_path_is_the_runs_vanilla(
    vgg_slow_link: tuple[Trace, Interference, tuple[object, object]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The framework path the benchmark gives the compiler (``framework_path``: vanilla's
    fitted calls and term) replays, in ``pace.compiler.framework_path_us``, to the period the
    benchmark predicts for vanilla; a schedule marked for that path is predicted as vanilla,
    and its program differs from its units' (so `pace@cal` trains them again); the run says
    which the compiler chose and both predictions."""
    from pace.compiler import framework_path_us

    trace, probe, schedules = vgg_slow_link
    step_us = 40e3
    trace = dataclasses.replace(
        trace,
        comm=dataclasses.replace(trace.comm, update_us_per_byte=step_us / trace.total_bytes),
        meta={**trace.meta, "optimizer_us": step_us},
    )
    vanilla_term = dataclasses.replace(
        probe, **VANILLA_CHANNEL, us_per_call=0.0, us_per_byte=0.0, idle_loss=0.0
    )
    fused = dataclasses.replace(trace.comm, beta_us_per_byte=trace.comm.beta_us_per_byte * 0.5)
    run = bench_netns.AsRun(
        terms={"*": dataclasses.replace(probe, idle_loss=0.0), "vanilla": vanilla_term},
        comms={"vanilla": fused},
    )
    assert bench_netns.framework_path("torch", run) is None
    path = bench_netns.framework_path("horovod", run)
    compiled = dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, framework=path))
    sims = bench_netns.simulate_variants(trace, *schedules, "horovod", as_run=run)
    assert framework_path_us(compiled) == pytest.approx(sims["vanilla"].period_ms * 1e3, rel=1e-9)
    schedule, sync = schedules
    marked = dataclasses.replace(schedule, framework="horovod")  # type: ignore[type-var]
    on_path = bench_netns.simulate_variants(trace, marked, sync, "horovod", as_run=run)
    assert on_path["pace"] == on_path["vanilla"]
    assert on_path["pace-sync"] == sims["pace-sync"]
    # With the launch's compute, it is predicted from vanilla's `local` (Horovod's defaults,
    # under which it trains), not the runtime's: the prediction is vanilla's.
    local_ms = {"local": 300.0, "local@vanilla": 360.0}
    in_job = bench_netns.simulate_in_job(
        trace, marked, sync, "horovod", as_run=run, local_ms=local_ms
    )
    assert in_job["pace"] == in_job["vanilla"]
    assert in_job["pace-sync"] != in_job["vanilla"]
    kept = bench_netns.simulate_in_job(
        trace, schedule, sync, "horovod", as_run=run, local_ms=local_ms
    )
    assert kept["pace"] != kept["vanilla"]
    assert bench_netns._program(marked) != bench_netns._program(schedule)
    # The run states the choice and its margin either way: kept units (the framework slower)
    # and the framework's path (it faster).
    slow = dataclasses.replace(
        path,
        beta_us_per_byte=path.beta_us_per_byte * 50,  # type: ignore[union-attr]
    )
    for framework, chosen in ((slow, False), (dataclasses.replace(path, alpha_us=0.0), True)):
        result = compile_trace(
            dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, framework=framework))
        )
        assert result.framework_us is not None
        assert (result.schedule.framework is not None) is chosen
        lines: list[str] = []
        monkeypatch.setattr(bench_netns, "_say", lines.append)
        bench_netns._say_framework("pace", result)
        assert len(lines) == 1
        assert ("chose Horovod's own path" in lines[0]) is chosen
        assert f"{result.framework_us / 1e3:.1f} ms" in lines[0]
        assert ("units must be 5% faster" in lines[0]) is chosen


def test_a_launch_starts_without_the_last_rate_s_logs(tmp_path: Path) -> None:
    """A variant trained through Horovod's own path logs no units: the report must find none,
    not the rate before's (the 2 Gbit/s rows of a run once showed 1 Gbit/s's channel)."""
    out = tmp_path / "train-horovod.json"
    stale = [out, Path(f"{out}.phases"), Path(f"{out}.pace.units.rank0")]
    kept = [tmp_path / "train-horovod.schedule.json", tmp_path / "handoff-horovod.json"]
    for f in (*stale, *kept):
        f.write_text("[]")
    bench_netns.clear_launch_outputs(out)
    assert [f for f in stale if f.exists()] == []
    assert all(f.exists() for f in kept)
    assert bench_netns.read_unit_logs(Path(f"{out}.pace.units")) is None


@settings(max_examples=8, deadline=None)
@given(scale=st.floats(0.6, 1.6))
def test_the_bound_takes_the_launchs_own_compute_and_no_replay_beats_it(
    vgg: tuple[Trace, Interference, tuple[object, object]], scale: float
) -> None:
    """With the compute the profile had, the launch's bound is the compiler's; a launch that
    computed faster or slower moves it the same way; and the replay of every variant from that
    launch's compute (the `calibrated` column) stays at or above it."""
    from pace.lp import lower_bound_us

    trace, probe, (schedule, sync) = vgg
    term = dataclasses.replace(probe, idle_loss=0.0)
    compiled = dataclasses.replace(trace, comm=dataclasses.replace(trace.comm, interference=term))
    own_s = bench_netns._compute_us(compiled) / 1e6
    same = bench_netns.launch_bound_ms(compiled, {"local": [own_s]})
    assert same == pytest.approx(lower_bound_us(compiled) / 1e3, rel=1e-6)
    measured = {"local": [own_s * scale], "pace": [1.0], "online": [1.0], "vanilla": [1.0]}
    bound = bench_netns.launch_bound_ms(compiled, measured)
    assert (bound - same) * (scale - 1.0) >= -1e-6 * same
    periods = bench_netns.launch_calibrated_ms(
        compiled, schedule, sync, "torch", as_run=_as_run(term, {}), measured=measured
    )
    assert periods
    assert min(periods.values()) >= bound * (1 - 1e-9)


def test_the_calibration_launch_shapes_the_trace_from_its_local_logs(
    vgg: tuple[Trace, Interference, tuple[object, object]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``job_shaped`` reads `local`'s marks and gradient times as the workers write them: the
    shaped trace, scaled to the launch's `local`, marks each gradient when the slower rank did
    (the median over the counted iterations) and the run says so; without gradient logs the
    trace stays the profile's, and the run says that."""
    import json

    from pace.drift.estimate import trace_spans

    trace, _, _ = vgg
    lines: list[str] = []
    monkeypatch.setattr(bench_netns, "_say", lines.append)
    ideal = sorted(trace_spans(trace).ready_us.values())
    local_s = 1.5 * bench_netns._compute_us(trace) / 1e6
    per_block = bench_netns.iterations_per_block(bench_netns.HANDOFF_STEPS)
    iterations = bench_netns.HANDOFF_BLOCKS * per_block
    # Rank 0 marks its gradients at the profile's pace x1.5, rank 1 the first half of them 40%
    # later and every later one that much later too (a monotone bend): the slower rank.
    half = ideal[len(ideal) // 2]
    rank1 = [min(1.4 * x, x + 0.4 * half) for x in ideal]
    want = [1.5 * x / 1e3 for x in rank1]  # ms
    prefix = tmp_path / "handoff-horovod.json.local"
    for r, curve in enumerate((ideal, rank1)):
        marks, grads = [], []
        for it in range(iterations):
            fwd_end = 100.0 * it + 0.1  # seconds apart: the profile's backward takes 7 s
            offsets = [1.5 * x / 1e6 for x in curve]
            marks.append((fwd_end - 0.1, fwd_end, fwd_end + offsets[-1] + 1e-3))
            grads += [fwd_end + o for o in offsets]
        Path(f"{prefix}.marks.rank{r}").write_text(json.dumps(marks))
        Path(f"{prefix}.grads.rank{r}").write_text(json.dumps(grads))
    periods = {"local": [local_s] * iterations}
    shaped = bench_netns.job_shaped(trace, prefix, periods)
    got = sorted(trace_spans(bench_netns.in_job(shaped, local_s * 1e3)).ready_us.values())
    assert got == pytest.approx([w * 1e3 for w in want], rel=1e-6)
    assert "the backward's shape in `local`" in lines[-1]
    assert "x1.40" in lines[-1]
    assert bench_netns.job_shaped(trace, tmp_path / "none", periods) is trace
    assert "the profile's" in lines[-1]
