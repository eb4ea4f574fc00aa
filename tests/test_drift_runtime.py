"""A drift-triggered schedule switch mid-training on 2 Horovod ranks, bitwise vs vanilla Horovod.

The worker (tests/drift_workers/train_switch.py) trains 1,000 iterations with jitter (random
sleeps on every rank, the runtime's own delay injection in hooks/dispatch/completion); rank 0's
trigger sees an injected 60% slow-down at iteration 300, recompiles in a background thread and
broadcasts the new schedule; both ranks switch at the same iteration boundary through the
runtime's ``switch_schedule``, and the runtime feeds the drift monitor (``wrap(monitor=)``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.worker_output import marked_results

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "drift_workers" / "train_switch.py"
BIN = Path(sys.executable).parent
STEPS = 1000
DRIFT_AT = 300
SYNC_EVERY = 10
LAG = 2

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.slow,
    pytest.mark.torch,
    pytest.mark.horovod,
]


def _results(stdout: str) -> dict[int, dict[str, Any]]:
    return {int(r["rank"]): r for r in marked_results(stdout, "DRIFT_RESULT ")}


@pytest.fixture(scope="module")
def results() -> dict[int, dict[str, Any]]:
    pytest.importorskip("horovod.torch", reason="build it with scripts/install_horovod.sh")
    horovodrun = shutil.which("horovodrun", path=str(BIN)) or "horovodrun"
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(WORKER)]
    cmd += ["--steps", str(STEPS), "--drift-at", str(DRIFT_AT)]
    cmd += ["--sync-every", str(SYNC_EVERY), "--lag", str(LAG)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = _results(proc.stdout)
    assert sorted(out) == [0, 1], proc.stdout[-3000:] + proc.stderr[-3000:]
    for res in out.values():
        assert "error" not in res, res["error"]
    return out


def test_switch_is_bitwise_identical_to_vanilla_horovod(results: dict[int, Any]) -> None:
    for rank in (0, 1):
        res = results[rank]
        assert res["moved"]
        assert res["equal"], f"rank {rank}: max |diff| {res['max_abs_diff']}"
    assert results[0]["fingerprint"] == results[1]["fingerprint"]


def test_both_ranks_switch_once_at_the_same_agreed_iteration(results: dict[int, Any]) -> None:
    s0, s1 = results[0]["switches"], results[1]["switches"]
    assert s0 == s1
    assert len(s0) == 1
    at = s0[0]
    assert DRIFT_AT < at < DRIFT_AT + 100
    assert at % SYNC_EVERY == LAG  # a sync point plus the lag
    assert results[0]["plans"] == results[1]["plans"]
    before, after = results[0]["plans"]
    assert len(after) < len(before)  # the recompile fused the small gradients
    assert [kind for _, kind in results[0]["events"]] == ["fired", "switched"]


def test_monitor_saw_every_iteration_and_no_thread_is_left(results: dict[int, Any]) -> None:
    for rank in (0, 1):
        assert results[rank]["monitored_iterations"] == STEPS
        # The runtime itself reported unit channel times to the monitor (wrap(monitor=)).
        assert results[rank]["unit_samples"] >= STEPS
        assert results[rank]["threads"] == []
