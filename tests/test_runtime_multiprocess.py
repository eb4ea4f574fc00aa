"""Two real ranks on loopback: the pace runtime vs vanilla data parallelism, bit for bit.

One launch per backend trains the same small CNN for 50 steps with the vanilla optimizer
(``hvd.DistributedOptimizer`` / DDP) and then with the runtime in several configurations
(a schedule with partitions and fusion groups, SGD and Adam, ByteScheduler's online mode,
random delays in hooks/dispatch/completion, the fallback); each test asserts on one of them.
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
WORKER = ROOT / "tests" / "runtime_workers" / "train.py"
BIN = Path(sys.executable).parent
STEPS = 50
CONFIGS = {
    "torch": "sgd,adam,sgd:online,adam:delay,sgd:online-delay,adam:switch-delay",
    "horovod": "sgd,adam,sgd:online,adam:delay,sgd:fallback,sgd:switch,sgd:framework",
}

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.torch]


def _schedule(tmp: Path) -> Path:
    sys.path.insert(0, str(WORKER.parent))
    try:
        from train import build_model, make_schedule
    finally:
        sys.path.pop(0)
    from pace.io import save_schedule

    path = tmp / "cnn.schedule.json"
    save_schedule(make_schedule(build_model()), path)
    return path


def _results(stdout: str) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["config"], r["rank"]): r for r in marked_results(stdout, "PACE_RESULT ")}


def _run(cmd: list[str], timeout_s: float) -> dict[tuple[str, int], dict[str, Any]]:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout_s, env=worker_env(), check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return _results(proc.stdout)


@pytest.fixture(scope="module")
def torch_results(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Any]:
    path = _schedule(tmp_path_factory.mktemp("torchrun"))
    cmd = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port())]
    cmd += [str(WORKER), "--backend", "torch", "--schedule", str(path)]
    cmd += ["--configs", CONFIGS["torch"], "--steps", str(STEPS)]
    return _run(cmd, 240)


@pytest.fixture(scope="module")
def horovod_results(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Any]:
    pytest.importorskip("horovod.torch", reason="build it with scripts/install_horovod.sh")
    horovodrun = shutil.which("horovodrun", path=str(BIN)) or "horovodrun"
    path = _schedule(tmp_path_factory.mktemp("horovodrun"))
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(WORKER)]
    cmd += ["--backend", "horovod", "--schedule", str(path)]
    cmd += ["--configs", CONFIGS["horovod"], "--steps", str(STEPS)]
    return _run(cmd, 300)


def _check(results: dict[tuple[str, int], Any], config: str) -> None:
    for rank in (0, 1):
        res = results.get((config, rank))
        assert res is not None, f"no result for {config} on rank {rank}: {sorted(results)}"
        assert "error" not in res, res["error"]
        assert res["moved"], "training did not change the parameters"
        assert res["equal"], f"{config} rank {rank}: max |diff| {res['max_abs_diff']}"
        assert res["threads_after_close"] == []


@pytest.mark.horovod
@pytest.mark.parametrize("config", ["sgd", "adam"])
def test_horovod_schedule_replay_is_bitwise_distributed_optimizer(
    horovod_results: dict[tuple[str, int], Any], config: str
) -> None:
    _check(horovod_results, config)
    assert horovod_results[(config, 0)]["warnings"] == []


@pytest.mark.horovod
def test_horovod_online_bytescheduler_is_bitwise_distributed_optimizer(
    horovod_results: dict[tuple[str, int], Any],
) -> None:
    _check(horovod_results, "sgd:online")


@pytest.mark.horovod
def test_horovod_random_delays_same_result_no_deadlock(
    horovod_results: dict[tuple[str, int], Any],
) -> None:
    _check(horovod_results, "adam:delay")


@pytest.mark.horovod
def test_horovod_schedule_switch_mid_training_is_bitwise(
    horovod_results: dict[tuple[str, int], Any],
) -> None:
    _check(horovod_results, "sgd:switch")


def test_torch_schedule_switch_mid_training_with_delays_is_bitwise(
    torch_results: dict[tuple[str, int], Any],
) -> None:
    _check(torch_results, "adam:switch-delay")


@pytest.mark.horovod
def test_horovod_fallback_warns_once_and_matches(
    horovod_results: dict[tuple[str, int], Any],
) -> None:
    """Rank 1 starts from other weights: equal to vanilla only if wrap broadcasts rank 0's."""
    _check(horovod_results, "sgd:fallback")
    for rank in (0, 1):
        warnings = horovod_results[("sgd:fallback", rank)]["warnings"]
        assert len(warnings) == 1
        assert "fc2.weight" in warnings[0]


@pytest.mark.horovod
def test_horovod_framework_schedule_trains_with_distributed_optimizer(
    horovod_results: dict[tuple[str, int], Any],
) -> None:
    """A schedule file marked ``framework: "horovod"``: hvd.DistributedOptimizer's bits, one
    warning naming the path with the compiler's two predictions (ms), one that the launch's
    Horovod settings (pace's: fusion and cache off) are not the ones predicted, one that the
    monitor passed gets no events."""
    _check(horovod_results, "sgd:framework")
    for rank in (0, 1):
        warnings = horovod_results[("sgd:framework", rank)]["warnings"]
        assert len(warnings) == 3, warnings
        assert "own data-parallel path" in warnings[0]
        assert "(12.3 ms per iteration against 23.5 ms)" in warnings[0]
        assert "--no-framework" in warnings[0]
        assert "without tensor fusion or the response cache" in warnings[1]
        assert "monitor= gets no events" in warnings[2]


@pytest.mark.horovod
def test_a_stalled_rank_on_horovods_own_path_is_an_error_naming_the_rank(
    tmp_path: Path,
) -> None:
    """On Horovod's own path (a schedule marked ``framework``) rank 1 stops issuing for 20 s
    at step 5: Horovod's own wait would spin until it comes back; the runtime's waits
    ``timeout_s`` (2 s), then rank 0 raises naming itself and a gradient."""
    pytest.importorskip("horovod.torch", reason="build it with scripts/install_horovod.sh")
    horovodrun = shutil.which("horovodrun", path=str(BIN)) or "horovodrun"
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(WORKER)]
    cmd += ["--backend", "horovod", "--schedule", str(_schedule(tmp_path))]
    cmd += ["--configs", "sgd:framework", "--steps", "10", "--timeout-s", "2"]
    cmd += ["--stall-rank", "1", "--stall-at", "5", "--stall-s", "20"]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=180, env=worker_env(), check=False
    )
    res = _results(proc.stdout).get(("sgd:framework", 0))
    assert res is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert res["error"].startswith("RuntimeReplayError: rank 0: Horovod's all-reduce of "), res
    assert "did not complete within 2 s" in res["error"]
    # Rank 0 gave up after its time-out, not after the stall.
    assert res["seconds"] < 15


@pytest.mark.parametrize("config", ["sgd", "adam"])
def test_torch_schedule_replay_is_bitwise_ddp(
    torch_results: dict[tuple[str, int], Any], config: str
) -> None:
    _check(torch_results, config)


def test_torch_online_bytescheduler_is_bitwise_ddp(
    torch_results: dict[tuple[str, int], Any],
) -> None:
    _check(torch_results, "sgd:online")


@pytest.mark.parametrize("config", ["adam:delay", "sgd:online-delay"])
def test_torch_random_delays_same_result_no_deadlock(
    torch_results: dict[tuple[str, int], Any], config: str
) -> None:
    _check(torch_results, config)


@pytest.mark.parametrize("config", ["sgd", "sgd:online"])
def test_a_dying_rank_surfaces_as_an_error_on_the_other(tmp_path: Path, config: str) -> None:
    """Rank 1 crashes at step 20; rank 0 must raise (naming itself and the unit), not hang."""
    path = _schedule(tmp_path)
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = worker_env()
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
        )
        cmd = [sys.executable, str(WORKER), "--backend", "torch", "--schedule", str(path)]
        cmd += ["--configs", config, "--die-rank", "1", "--die-at", "20", "--timeout-s", "15"]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=120) for p in procs]
    assert procs[1].returncode == 17  # the simulated crash
    assert procs[0].returncode == 0, outs[0][1][-3000:]
    res = _results(outs[0][0])[(config, 0)]
    assert res["error"].startswith("RuntimeReplayError: rank 0: ")
    assert "of iteration 19" in res["error"] or "of iteration 20" in res["error"]
    assert ("unit " in res["error"]) or ("probe" in res["error"])
    assert res["threads_after_close"] == []
