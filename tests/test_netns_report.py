"""The throttled-link benchmark's report arithmetic (benchmarks/bench_netns.py), no link needed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks._common import thread_cpu_ms
from benchmarks.bench_netns import (
    CAUSES,
    Row,
    _print_goal,
    against_vanilla,
    cause_summary,
    cpu_floor_ms,
    error_cause,
    goal_verdict,
    ranking_agreement,
    read_cpu,
    read_threads,
    replacement_gains,
    within_noise,
)


def _row(variant: str, measured: float, iqr: float, predicted: float, rate: str = "1gbit") -> Row:
    return Row(
        rate=rate,
        backend="torch",
        variant=variant,
        measured_ms=measured,
        spread_ms=iqr,
        predicted_ms=predicted,
        independent_ms=None,
    )


def test_ranking_counts_only_pairs_the_run_can_tell_apart() -> None:
    rows = [
        _row("vanilla", 700.0, 40.0, 650.0),
        _row("pace", 600.0, 40.0, 560.0),  # 100 ms apart: resolved, same order
        _row("online", 610.0, 40.0, 700.0),  # 10 ms from pace: within the spread
        _row("local", 400.0, 10.0, 380.0),  # calibrates, never ranked
        _row("pace", 100.0, 1.0, 900.0, rate="2gbit"),  # another rate: never paired
    ]
    agree, against, close, alike = ranking_agreement(rows)
    assert agree == ["1gbit torch vanilla/pace"]
    assert against == ["1gbit torch vanilla/online"]  # 90 ms apart, predicted the other way
    assert close == 1
    assert alike == []
    # The same program (pace on Horovod's own path, predicted as vanilla) measured apart:
    # neither order, named apart.
    same = [_row("vanilla", 914.7, 83.8, 948.7), _row("pace", 969.5, 95.8, 948.7)]
    assert ranking_agreement(same) == ([], [], 0, ["1gbit torch vanilla/pace"])


@given(
    st.lists(
        st.tuples(st.floats(100, 1000), st.floats(0, 200), st.floats(100, 1000)),
        min_size=2,
        max_size=6,
    )
)
def test_every_pair_is_counted_once_and_a_perfect_model_always_agrees(
    cells: list[tuple[float, float, float]],
) -> None:
    rows = [_row(f"v{i}", m, iqr, p) for i, (m, iqr, p) in enumerate(cells)]
    agree, against, close, alike = ranking_agreement(rows)
    n = len(rows)
    assert len(agree) + len(against) + close + len(alike) == n * (n - 1) // 2
    exact = [_row(f"v{i}", m, iqr, m) for i, (m, iqr, _) in enumerate(cells)]
    assert ranking_agreement(exact)[1] == []


def test_the_cpu_file_gives_core_ms_per_iteration_and_the_busy_fraction(tmp_path: Path) -> None:
    # Two blocks of one variant: 900 + 1100 busy core-ms over 1000 + 1000 ms of wall for 4 + 4
    # periods on 2 cores.
    path = tmp_path / "train.json.cpu"
    path.write_text(json.dumps({"pace": [[900.0, 1000.0, 4], [1100.0, 1000.0, 4]]}))
    assert read_cpu(path, cores=2) == {"pace": (250.0, 0.5)}


def test_the_threads_files_split_each_iteration_over_both_ranks(tmp_path: Path) -> None:
    # Rank 0: two blocks of 4 and 4 periods; rank 1: the same blocks. Per iteration, summed
    # over the ranks: training (400 + 480) / 8 + (440 + 440) / 8 = 220, runtime (40 + 40 + 24 +
    # 24) / 8 = 16, backend (80 + 80 + 72 + 88) / 8 = 40; the host's 300 core-ms less these
    # leaves 24 for the kernel. A variant the host reading lacks gets no kernel share.
    def block(training: float, runtime: float, backend: float) -> list[object]:
        return [{"training": training, "runtime": runtime, "backend": backend}, 4]

    files = {
        0: {"pace": [block(400, 40, 80), block(480, 40, 80)], "local": [block(300, 0, 8)]},
        1: {"pace": [block(440, 24, 72), block(440, 24, 88)], "local": [block(340, 0, 8)]},
    }
    for r, blocks in files.items():
        (tmp_path / f"train.json.threads.rank{r}").write_text(json.dumps(blocks))
    got = read_threads(tmp_path / "train.json", {"pace": 300.0})
    assert got["pace"] == pytest.approx(
        {"training": 220.0, "runtime": 16.0, "backend": 40.0, "kernel": 24.0}
    )
    assert got["local"] == pytest.approx({"training": 160.0, "runtime": 0.0, "backend": 4.0})


def test_thread_cpu_is_split_by_who_ran() -> None:
    """A busy thread named pace-* counts as the runtime's, the main thread's work as training,
    and a thread of any other name as the backend's (there: gloo's or Horovod's C++ threads)."""
    import threading
    import time

    def spin(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    before = thread_cpu_ms()
    for name in ("pace-test", "other"):
        t = threading.Thread(target=spin, args=(0.2,), name=name)
        t.start()
        # Read while it lives: an ended thread's CPU falls into `backend` (the docstring).
        time.sleep(0.1)
        during = thread_cpu_ms()
        t.join()
        if name == "pace-test":
            assert during["runtime"] - before["runtime"] > 30.0
    spin(0.1)
    after = thread_cpu_ms()
    assert after["training"] - before["training"] > 50.0
    # Both spinning threads have ended: 0.3 s of theirs, at least most of it, is `backend`.
    assert after["backend"] - before["backend"] > 150.0
    assert sum(after.values()) >= sum(before.values())


# (fraction of the cores busy, median period ms) per variant
busy_and_period = st.tuples(st.floats(0.01, 1.0), st.floats(1.0, 1e4))


@given(
    st.dictionaries(st.sampled_from(["vanilla", "online", "pace", "pace-sync"]), busy_and_period),
    st.dictionaries(st.sampled_from(["local", "local@vanilla"]), busy_and_period),
)
def test_the_cpu_floor_is_the_cheapest_communicating_variants_cpu_per_period(
    communicating: dict[str, tuple[float, float]], local: dict[str, tuple[float, float]]
) -> None:
    both = communicating | local
    floor = cpu_floor_ms({k: u for k, (u, _) in both.items()}, {k: t for k, (_, t) in both.items()})
    if not communicating:
        assert floor is None  # `local` moves no bytes: it is no floor for a schedule
        return
    assert floor is not None
    assert floor == min(u * t for u, t in communicating.values())
    # Never above the period of a program it was measured on, whichever is the cheapest.
    assert all(floor <= t for _, t in communicating.values())


def test_the_goal_table_takes_the_higher_of_the_link_bound_and_the_cpu_floor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def row(variant: str, measured: float, **kw: float) -> Row:
        return dataclasses.replace(_row(variant, measured, 10.0, measured), **kw)

    for floor, most in ((400.0, 500.0), (550.0, 550.0)):
        rows = [
            row("vanilla", 600.0, cores_busy=0.9),
            row("local", 450.0),
            row("pace", 520.0, bound_ms=500.0, cpu_floor_ms=floor),
        ]
        _print_goal(rows)
        out = capsys.readouterr().out
        assert "+33%" in out  # exposed over `local` (its ranks in step)
        assert "+50%" not in out
        _print_goal([*rows, row("local-free", 400.0)])
        # ... and over the ranks running free, beside it; the verdicts are judged by `local`.
        assert "+50%" in capsys.readouterr().out
        assert f"{600.0 / 520.0:.3f}x" in out  # the speed-up
        assert f"{600.0 / most:.3f}x" in out  # the most any schedule could gain
        assert "90%" in out
        # Exposed 33%, 1.154x: the goal met; no CIs on these rows: no verdict against vanilla.
        assert "within the spread" in out
        assert "met" in out
        assert "not met" not in out


def test_the_goal_table_says_where_pace_measured_below_the_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 2 Gbit/s with DDP, 2026-11-28: the bound scaled to a `local` that ran slow.
    def row(variant: str, measured: float, **kw: float) -> Row:
        return dataclasses.replace(_row(variant, measured, 10.0, measured), **kw)

    rows = [
        row("vanilla", 805.4, cores_busy=0.87),
        row("local", 673.5),
        row("pace", 744.7, bound_ms=796.8, cpu_floor_ms=703.7),
    ]
    _print_goal(rows)
    out = capsys.readouterr().out
    assert f"{805.4 / 796.8:.3f}x (pace below the bound)" in out
    assert "out of reach" not in out
    assert "not met" in out


@pytest.mark.parametrize(
    ("vanilla_ci", "pace_ci", "want"),
    [
        ((1275.0, 1342.0), (1143.0, 1212.0), "faster"),  # 0.5 Gbit/s, Horovod, 2026-11-25
        ((732.0, 795.0), (818.0, 951.0), "slower"),  # 2 Gbit/s, Horovod, the same run
        ((835.0, 880.0), (782.0, 871.0), "within the spread"),  # 2 Gbit/s, torch
        ((800.0, 900.0), (900.0, 950.0), "within the spread"),  # touching: not apart
        (None, (700.0, 720.0), "within the spread"),  # no CI: no verdict either way
    ],
)
def test_pace_against_vanilla_is_decided_by_the_cis(
    vanilla_ci: tuple[float, float] | None, pace_ci: tuple[float, float], want: str
) -> None:
    vanilla = dataclasses.replace(_row("vanilla", 800.0, 10.0, 800.0), median_ci_ms=vanilla_ci)
    pace = dataclasses.replace(_row("pace", 800.0, 10.0, 800.0), median_ci_ms=pace_ci)
    assert against_vanilla(vanilla, pace) == want


@pytest.mark.parametrize(
    ("exposed", "speedup", "most", "want"),
    [
        (1.00, 1.142, 1.273, "not met"),  # 0.5 Gbit/s, Horovod, 2026-11-25
        (0.28, 0.983, 1.142, "out of reach"),  # 2 Gbit/s, torch: no schedule could
        (-0.04, 0.836, 1.032, "n/a"),  # 2 Gbit/s, Horovod: nothing exposed to win back
        (0.149, 1.0, 1.5, "n/a"),  # just below the threshold
        (0.15, 1.15, 1.2, "met"),  # at the threshold and at the goal
        (0.84, 1.168, 1.326, "met"),  # 0.5 Gbit/s, Horovod, the day's other run
        (0.5, 1.1, None, "not met"),  # no bound known: not "out of reach"
        # 2 Gbit/s, torch, 2026-11-28: pace measured below the bound: it bounds nothing.
        (0.20, 1.082, 1.011, "not met"),
    ],
)
def test_the_goal_applies_where_vanilla_is_exposed(
    exposed: float, speedup: float, most: float | None, want: str
) -> None:
    assert goal_verdict(exposed, speedup, most) == want


@pytest.mark.parametrize(
    ("env", "cores", "want"),
    [
        ({"PACE_BENCH_PIN": "1", "RANK": "1"}, {0, 1}, 1),  # torch.distributed's rank
        ({"PACE_BENCH_PIN": "1", "HOROVOD_RANK": "0", "RANK": "1"}, {2, 3}, 2),  # Horovod's wins
        ({"PACE_BENCH_PIN": "1", "HOROVOD_RANK": "3"}, {4, 6}, 6),  # rank % cores, in order
        ({"RANK": "1"}, {0, 1}, None),  # not asked: nothing pinned
    ],
)
def test_pin_puts_each_rank_on_a_core_of_its_own(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], cores: set[int], want: int | None
) -> None:
    from benchmarks import bench_netns

    for key in ("PACE_BENCH_PIN", "RANK", "HOROVOD_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pinned: list[set[int]] = []
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(cores))
    monkeypatch.setattr("os.sched_setaffinity", lambda _pid, c: pinned.append(c))
    assert bench_netns.pin_rank() == want
    assert pinned == ([] if want is None else [{want}])


def test_iqr_is_the_quartiles_apart_and_zero_below_two_values() -> None:
    from benchmarks._common import iqr

    xs = [100.0, 110.0, 120.0]
    assert iqr(xs) == 20.0  # statistics' default ("exclusive") quartiles: 100 and 120
    assert iqr(xs, method="inclusive") == 10.0  # 105 and 115
    assert iqr([5.0]) == 0.0
    assert iqr([]) == 0.0


def _cause_row(measured: float, variant: str = "pace", **kw: Any) -> Row:
    """A row with only what ``error_cause`` reads: the prediction none unless given."""
    return dataclasses.replace(_row(variant, measured, 0.0, 0.0), **{"predicted_ms": None, **kw})


def test_a_miss_is_explained_by_the_first_measured_cause_that_accounts_for_it() -> None:
    ci = (960.0, 1040.0)
    cause = error_cause
    assert cause(_cause_row(1000.0)) is None  # nothing predicted
    assert cause(_cause_row(1000.0, predicted_ms=1049.0)) == "within 5%"
    assert cause(_cause_row(1000.0, predicted_ms=1100.0, median_ci_ms=(900.0, 1120.0))) == (
        "the run's noise"
    )
    # The launch's own compute brings the replay within 5%: the host's speed moved.
    assert cause(_cause_row(1000.0, predicted_ms=880.0, calibrated_ms=1030.0, median_ci_ms=ci)) == (
        "compute drift"
    )
    # A `local` row measures that drift itself.
    assert cause(_cause_row(1000.0, variant="local", predicted_ms=800.0, median_ci_ms=ci)) == (
        "compute drift"
    )
    # The same program a launch earlier was further off than the prediction.
    launch = _cause_row(1000.0, predicted_ms=880.0, calibrated_ms=860.0, repeat_ms=860.0)
    assert cause(launch) == "launch drift"
    # Or the prediction is where that launch measured it (within 5%): 2 Gbit/s with Horovod,
    # online, 2026-11-27: predicted 1174.8, the calibration launch 1172.4, this one 1002.1.
    assert cause(dataclasses.replace(launch, repeat_ms=900.0)) == "launch drift"
    online = _cause_row(1002.1, predicted_ms=1174.8, calibrated_ms=1154.3, repeat_ms=1172.4)
    assert cause(online) == "launch drift"
    # Neither: the prediction off the program's measurement in both launches.
    assert cause(dataclasses.replace(launch, repeat_ms=940.0)) == "the model"


@settings(max_examples=60, deadline=None)
@given(
    measured=st.floats(100.0, 2000.0),
    rel=st.lists(st.floats(-0.5, 0.5), min_size=3, max_size=3),
    ci=st.booleans(),
)
def test_every_prediction_gets_exactly_one_cause_and_the_model_only_when_nothing_else_holds(
    measured: float, rel: list[float], ci: bool
) -> None:
    pred, cal, rep = (measured * (1 + x) for x in rel)
    row = _cause_row(
        measured,
        predicted_ms=pred,
        calibrated_ms=cal,
        repeat_ms=rep,
        median_ci_ms=(measured * 0.97, measured * 1.03) if ci else None,
    )
    got = error_cause(row)
    assert got in CAUSES
    if got == "the model":
        assert abs(pred - measured) > 0.05 * measured
        assert not within_noise(cal, row)
        assert abs(rep - measured) < abs(pred - measured)
        assert abs(pred - rep) > 0.05 * rep
    summary = cause_summary([row])
    assert f"1 {got}" in summary
    assert ("1gbit torch pace" in summary) == (got == "the model")


def test_replacement_gains_pair_each_new_schedule_with_the_one_it_replaced() -> None:
    rows = [
        _row("pace", 540.0, 30.0, 500.0),
        _row("pace@cal", 550.0, 30.0, 520.0),  # the calibration's: predicted 20 ms slower
        _row("pace-nohedge", 600.0, 30.0, 490.0),  # the nominal pick: predicted fastest
        _row("pace-sync", 610.0, 30.0, 600.0),  # no `pace-sync@cal`: nothing replaced
        _row("pace", 300.0, 30.0, 290.0, rate="2gbit"),  # another rate: its own pairs
        _row("pace@cal", 280.0, 30.0, 300.0, rate="2gbit"),
    ]
    gains = {(g.rate, g.variant): g for g in replacement_gains(rows)}
    assert set(gains) == {("1gbit", "pace"), ("1gbit", "pace-nohedge"), ("2gbit", "pace")}
    g = gains["1gbit", "pace"]
    assert g.replaced == "pace@cal"
    assert g.predicted_gain == pytest.approx(1 - 500 / 520)
    assert g.measured_gain == pytest.approx(1 - 540 / 550)
    # The model's favourite measured slower than the schedule it replaced: a negative gain.
    assert gains["1gbit", "pace-nohedge"].measured_gain == pytest.approx(1 - 600 / 550)
    assert gains["2gbit", "pace"].measured_gain < 0 < gains["2gbit", "pace"].predicted_gain
    # No prediction, no pair.
    unpredicted = [*rows[:1], dataclasses.replace(rows[1], predicted_ms=None)]
    assert replacement_gains(unpredicted) == []
