"""The whole pipeline on a real model: profile -> compile -> schedule file -> 2-rank training.

The mission in one test: ``pace.profiler.profile`` records real iterations of the runtime tests'
small CNN, ``compile_trace`` fuses and schedules them, the schedule is written as a file, and two
``torchrun`` ranks train with ``pace.runtime.wrap`` replaying that file; the parameters must be
bitwise identical to DDP's (the worker checks and reports).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pace.compiler import compile_trace  # noqa: E402
from pace.io import load_schedule, save_schedule  # noqa: E402
from pace.ir import CommModel  # noqa: E402
from pace.verify import verify_schedule  # noqa: E402
from tests.test_runtime_multiprocess import BIN, WORKER, _check, _run  # noqa: E402
from tests.worker_output import free_port  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.torch]


def test_profiled_and_compiled_schedule_trains_bitwise_like_ddp(tmp_path: Path) -> None:
    sys.path.insert(0, str(WORKER.parent))
    try:
        from train import BATCH, build_model
    finally:
        sys.path.pop(0)
    from pace.profiler import profile

    model = build_model()
    x = torch.randn(BATCH, 1, 12, 12)
    y = torch.randint(0, 10, (BATCH,))

    def step(m: torch.nn.Module) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(m(x), y)

    # A slow link makes communication matter for this small model, so the compiler has to
    # order, split or fuse rather than tie with FIFO.
    comm = CommModel(workers=2, alpha_us=30.0, beta_us_per_byte=0.02)
    trace = profile(model, step, iters=3, warmup=1, comm=comm, name="small-cnn")
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {t.name for t in trace.tensors} == names

    result = compile_trace(trace)
    assert result.predicted_iteration_us <= result.baselines["fifo"]
    path = tmp_path / "small-cnn.schedule.json"
    save_schedule(result.schedule, path)
    verify_schedule(load_schedule(path), trace, where=str(path))

    cmd = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port())]
    cmd += [str(WORKER), "--backend", "torch", "--schedule", str(path)]
    cmd += ["--configs", "sgd,adam", "--steps", "30"]
    results = _run(cmd, 240)
    _check(results, "sgd")
    _check(results, "adam")
