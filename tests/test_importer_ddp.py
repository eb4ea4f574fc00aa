"""``pace import`` of a real data-parallel job: two processes train with DDP over gloo, rank 0
records its steps with ``pace.importer.record``; the import has the model's gradients and the
all-reduces DDP ran, fitted as the trace's cost model."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch

from pace.importer import import_trace

pytestmark = [pytest.mark.torch, pytest.mark.multiprocess]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch import nn

    from pace.importer import record

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)
    )
    # Small buckets: several all-reduces of different sizes per step.
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step(m: nn.Module) -> torch.Tensor:
        return nn.functional.cross_entropy(m(x), y)

    # DDP rebuilds its buckets during the second step: two warm-up steps.
    warmup, iters = 2, 1
    if rank == 0:
        record(
            ddp,
            step,
            kineto=Path(out) / "kineto.json",
            execution_trace=Path(out) / "et.json",
            optimizer=opt,
            iters=iters,
            warmup=warmup,
        )
    else:  # the same steps, unrecorded
        for _ in range(warmup + 1 + iters):
            for p in ddp.parameters():
                p.grad = None
            step(ddp).backward()
            opt.step()
    dist.destroy_process_group()


def test_ddp_over_gloo(tmp_path: Path) -> None:
    port = _free_port()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_rank, args=(r, port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    result = import_trace(tmp_path / "kineto.json", execution_trace=tmp_path / "et.json")
    trace = result.trace
    assert {t.name: t.size_bytes for t in trace.tensors} == {
        "module.0.weight": 64 * 256 * 4,
        "module.0.bias": 256 * 4,
        "module.2.weight": 256 * 128 * 4,
        "module.2.bias": 128 * 4,
        "module.4.weight": 128 * 10 * 4,
        "module.4.bias": 10 * 4,
    }
    assert trace.meta["parameter_names"] == "trace markers"
    assert trace.meta["import"]["observer_in_timings"] is False
    comm = result.comm
    assert comm.source == "gloo"
    assert comm.workers == 2
    assert len(comm.samples) >= 2
    # Every bucket's bytes are a sum of whole gradients.
    assert sum(b for b, _ in comm.samples) <= 2 * trace.total_bytes
    assert comm.model is not None
    assert trace.comm.samples == comm.samples
    assert trace.comm.workers == 2
    assert trace.meta["comm_source"] == "measured"
