"""``pace simulate`` and ``pace compare`` end to end (in process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pace.cli import main
from pace.io import save_schedule, save_trace, trace_digest
from pace.ir import Schedule
from pace.sim import POLICIES
from tests.test_sim import TINY_OPTIMAL_UNITS, tiny


@pytest.fixture
def tiny_path(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.trace.json"
    save_trace(tiny(), path)
    return path


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(args) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_simulate_policy_json(tiny_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(["simulate", str(tiny_path), "--policy", "fifo", "--json"], capsys)
    assert out["iteration_us"] == 44
    assert out["options"] == {
        "credit": 1,
        "barrier": True,
        "one_compute_stream": False,
        "credit_bytes": None,
        "queued": False,
        "agreed_readiness": False,
    }


def test_simulate_options(tiny_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(
        ["simulate", str(tiny_path), "--policy", "fifo", "--credit", "2", "--json"], capsys
    )
    # Comm ends at 34 (test_credit_two_shares_the_bandwidth); fifo's barrier: forward 34-44.
    assert out["iteration_us"] == pytest.approx(44)
    out = run_json(
        ["simulate", str(tiny_path), "--policy", "fifo", "--credit", "2", "--no-barrier", "--json"],
        capsys,
    )
    assert out["iteration_us"] == pytest.approx(39)
    out = run_json(
        ["simulate", str(tiny_path), "--policy", "tictac", "--one-compute-stream", "--json"],
        capsys,
    )
    assert out["iteration_us"] == 44
    # Two queued instead of sharing (39 above): one at a time again, fifo's credit-1 time.
    queued = ["--credit", "2", "--queued", "--no-barrier", "--json"]
    out = run_json(["simulate", str(tiny_path), "--policy", "fifo", *queued], capsys)
    assert out["iteration_us"] == pytest.approx(44)
    assert out["options"]["queued"] is True  # type: ignore[index]
    plain = run_json(["simulate", str(tiny_path), "--policy", "tictac", "--json"], capsys)
    agreed = run_json(
        ["simulate", str(tiny_path), "--policy", "tictac", "--agreed-readiness", "--json"], capsys
    )
    # Every unit waits for its readiness to be agreed (the first for a probe round).
    assert agreed["comm_end_us"] > plain["comm_end_us"]  # type: ignore[operator]


def test_simulate_schedule_file(
    tiny_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tiny()
    sched = Schedule(
        trace_digest=trace_digest(trace),
        cost_model=trace.comm,
        units=TINY_OPTIMAL_UNITS,
        predicted_iteration_us=39,
    )
    path = tmp_path / "tiny.schedule.json"
    save_schedule(sched, path)
    out = run_json(["simulate", str(tiny_path), "--schedule", str(path), "--json"], capsys)
    assert out["iteration_us"] == 39
    assert out["matches_prediction"] is True
    out = run_json(
        ["simulate", str(tiny_path), "--schedule", str(path), "--barrier", "--json"], capsys
    )
    assert out["iteration_us"] == 44


def test_compare_json_lists_every_policy(
    tiny_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_json(["compare", str(tiny_path), "--json"], capsys)
    baselines = out["baselines"]
    assert isinstance(baselines, dict)
    assert set(baselines) == set(POLICIES)
    assert baselines["fifo"] == 44
    assert baselines["tictac"] == 44
    assert out["critical_path_us"] == 30
    lower = out["lower_bound_us"]
    assert isinstance(lower, float)
    assert 30 <= lower <= min(baselines.values())


def test_compare_table(tiny_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(tiny_path)]) == 0
    text = capsys.readouterr().out
    for name in POLICIES:
        assert name in text
    assert "lower bound" in text


def test_compare_what_if_bandwidth_changes_times(
    tiny_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_json(["compare", str(tiny_path), "--bandwidth-gbps", "100", "--json"], capsys)
    baselines = out["baselines"]
    assert isinstance(baselines, dict)
    # 24 bytes at 100 Gbps take a fraction of a microsecond: only compute is left.
    assert baselines["fifo"] == pytest.approx(30, abs=0.1)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--policy", "nope"], "--policy"),
        (["--policy", "fifo", "--credit", "0"], "--credit"),
        (["--policy", "horovod", "--queued"], "--queued"),
        (["--policy", "horovod", "--agreed-readiness"], "--agreed-readiness"),
    ],
)
def test_simulate_bad_options_exit_2(
    tiny_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    assert main(["simulate", str(tiny_path), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1


def test_missing_trace_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(tmp_path / "none.json")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_compare_subset_of_policies(tiny_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(["compare", str(tiny_path), "--policies", "tictac,p3", "--json"], capsys)
    assert out["baselines"] == {"fifo": 44, "tictac": 44, "p3": 44}
    assert main(["compare", str(tiny_path), "--policies", "tictac,nope"]) == 2
    assert "--policies" in capsys.readouterr().err


DATA = Path(__file__).parent / "data"


def test_shipped_tiny_files_replay_as_worked_out(capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(DATA / "tiny.trace.json")
    sched = str(DATA / "tiny.schedule.json")
    out = run_json(["simulate", trace, "--schedule", sched, "--json"], capsys)
    assert out["iteration_us"] == 39
    assert out["matches_prediction"] is True
    out = run_json(["simulate", trace, "--policy", "fifo", "--no-barrier", "--json"], capsys)
    assert out["iteration_us"] == 44


def test_simulate_byte_window(tiny_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # tictac on tiny with a 10-byte window: layer2 fills it, layer1 waits: 44 (see
    # test_byte_window_holds_back_a_unit_while_the_bytes_in_flight_reach_it); 21 bytes: 39.
    args = ["simulate", str(tiny_path), "--policy", "tictac", "--json"]
    out = run_json([*args, "--credit-bytes", "10", "--credit", "4"], capsys)
    assert out["iteration_us"] == 44
    out = run_json([*args, "--credit-bytes", "21", "--credit", "4"], capsys)
    assert out["iteration_us"] == pytest.approx(39)
    assert main([*args, "--credit-bytes", "0"]) == 2
    assert "--credit-bytes" in capsys.readouterr().err
