"""The torch backend's group runs collectives in issue order (``Backend.in_order``), which is
what lets a replay queue every ready unit (pace.runtime.optimizer._credit_bytes): two real
gloo ranks, a large all-reduce started before a tiny one must finish first. The control, a
plain ``new_group`` with torch's two gloo worker threads, shows the test can fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.worker_output import free_port, marked_results, worker_env

pytest.importorskip("torch")
pytestmark = [pytest.mark.multiprocess, pytest.mark.torch]

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "runtime_workers" / "order.py"


def test_torch_backend_runs_collectives_in_issue_order() -> None:
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2"]
    cmd += ["--master-port", str(free_port()), str(WORKER)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=worker_env(), check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = marked_results(proc.stdout, "PACE_ORDER ")
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert r["in_order"] is True
        assert all(r["ours"]), r  # the large one, started first, always finished first
    # Two worker threads: the tiny one overtakes the large one (else this test proves nothing).
    assert any(not ok for r in results for ok in r["control"]), results


FALLBACK = """
import warnings
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
del dist.ProcessGroupGloo._Options  # a torch without the private pieces
from pace.runtime.backends import TorchBackend
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    backend = TorchBackend()
buf = torch.ones(4)
backend.wait(backend.start(buf, "x"), 10.0)
print("PACE_FALLBACK", backend.in_order, buf.tolist(), [str(w.message) for w in caught])
"""


def test_without_a_one_thread_group_the_backend_says_it_is_not_in_order() -> None:
    """Then the replay sends one unit at a time (optimizer._credit_bytes), never two side by
    side unknowingly; the user is told once."""
    proc = subprocess.run(
        [sys.executable, "-c", FALLBACK.format(port=free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        env=worker_env(),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PACE_FALLBACK"))
    assert line.startswith("PACE_FALLBACK False [1.0, 1.0, 1.0, 1.0]"), line
    assert "one unit at a time" in line
