"""``wrap(..., drift=...)`` on two real ranks with real timings: the one switch for the user.

The worker (tests/drift_workers/train_drift.py) compiles an unfused schedule from a trace whose
link is 100x slower than loopback, so the trigger fires early; rank 0 re-estimates the link from
the runtime's own unit timings and recompiles in the background; every rank switches at the
same iteration. One launch per backend runs the overlapped and the synchronous mode (with
gradient clipping, the sync mode's reason to exist), each against DDP / Horovod bitwise.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.worker_output import free_port, marked_results, worker_env

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "drift_workers" / "train_drift.py"
BIN = Path(sys.executable).parent
STEPS = 120
MODES = ("overlap", "sync")

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.torch]


def _run(cmd: list[str]) -> dict[tuple[str, int], dict[str, Any]]:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env=worker_env(), check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = {(r["mode"], int(r["rank"])): r for r in marked_results(proc.stdout, "DRIFT_RESULT ")}
    assert sorted(out) == sorted((m, r) for m in MODES for r in (0, 1)), proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def torch_results() -> dict[tuple[str, int], dict[str, Any]]:
    cmd = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port())]
    return _run([*cmd, str(WORKER), "--backend", "torch", "--steps", str(STEPS)])


@pytest.fixture(scope="module")
def horovod_results() -> dict[tuple[str, int], dict[str, Any]]:
    pytest.importorskip("horovod.torch", reason="build it with scripts/install_horovod.sh")
    horovodrun = shutil.which("horovodrun", path=str(BIN)) or "horovodrun"
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(WORKER)]
    return _run([*cmd, "--backend", "horovod", "--steps", str(STEPS)])


def _check(results: dict[tuple[str, int], dict[str, Any]], mode: str) -> None:
    r0, r1 = results[(mode, 0)], results[(mode, 1)]
    for res in (r0, r1):
        assert "error" not in res, res["error"]
        assert res["equal"], f"{mode} rank {res['rank']}: max |diff| {res['max_abs_diff']}"
        assert res["threads"] == []
    # Every rank switched, at the same iterations, to the same (fused) plan.
    assert r0["switched_at"] == r1["switched_at"]
    assert r0["switched_at"], r0["log"]
    assert r0["switched_at"][0] <= 40
    assert r0["units"] == r1["units"] < 16
    kinds = [kind for _, kind in r0["events"]]
    assert kinds[:2] == ["fired", "switched"], r0["events"]
    assert r1["events"] == []  # only rank 0 re-plans
    # One log line per decision, and the window written for `pace recompile`.
    assert any("drift fired" in line for line in r0["log"]), r0["log"]
    assert any(": switch:" in line for line in r0["log"]), r0["log"]
    assert any("switches to the new schedule" in line for line in r1["log"]), r1["log"]
    assert r0["stats_files"] >= 1
    assert r0["stats_iterations"] >= 5


@pytest.mark.parametrize("mode", MODES)
def test_torch_drift_switch_is_bitwise_ddp_and_agreed(
    torch_results: dict[tuple[str, int], dict[str, Any]], mode: str
) -> None:
    _check(torch_results, mode)


@pytest.mark.horovod
@pytest.mark.parametrize("mode", MODES)
def test_horovod_drift_switch_is_bitwise_and_agreed(
    horovod_results: dict[tuple[str, int], dict[str, Any]], mode: str
) -> None:
    _check(horovod_results, mode)
