"""GPU worker for tests/test_gpu.py: pace's runtime on CUDA tensors vs DDP, bit for bit.

Launched by ``torchrun --nproc-per-node N`` (``python -m torch.distributed.run``) with
``--backend gloo`` (two ranks may share one GPU: NCCL refuses two ranks on one device) or
``--backend nccl`` (one rank per GPU). Every rank puts its model on ``cuda:(local_rank % GPUs)``.
For each case the worker trains DDP (the reference) and then pace (``backend="torch"``) in each
requested mode from the same initial state and data, and prints one line per rank and
(case, mode)::

    PACE_RESULT {"case": "sgd:overlap", "rank": 0, "equal": true, "ranks_agree": true, ...}

Models, batches, schedules (partitions and fusion groups) and the comparison are those of
tests/runtime_workers/loops.py; only the device differs. cuDNN runs deterministically here
(``ref_repeat_equal`` checks the reference against itself), else DDP would not even equal DDP.

``--syncdebug``: one more case, run under ``torch.cuda.set_sync_debug_mode("warn")`` after
warm-up: every synchronising CUDA call made from Python (training thread, autograd hooks, the
runtime's threads) is counted per thread, for DDP and for pace, and printed as
``PACE_SYNC {...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))  # the repository, when run as a script
sys.path.insert(0, str(HERE.parents[1] / "runtime_workers"))

import loops  # noqa: E402

import pace.runtime  # noqa: E402

RESULT = "PACE_RESULT "
SYNC = "PACE_SYNC "
STEPS = 8


# case -> (model, loop, optimizer, DDP find_unused_parameters, modes)
CASES: dict[str, tuple[str, str, str, bool, tuple[str, ...]]] = {
    "sgd": ("cnn", "plain", "sgd", False, ("overlap", "sync")),
    "adam": ("cnn", "plain", "adam", False, ("overlap", "sync")),
    "online-sgd": ("cnn", "plain", "sgd", False, ("online",)),
    "bn": ("bn", "plain", "sgd", False, ("overlap", "sync")),
    "tied": ("tied", "plain", "sgd", False, ("overlap", "sync")),
    "unused-branch": ("branch", "branch", "sgd", True, ("overlap", "sync")),
    "unused-rank0": ("branch", "rank0-aux", "adam", True, ("overlap", "sync")),
    "accum": ("mlp", "accum", "sgd", False, ("overlap", "sync")),
    "bf16": ("mlp", "bf16", "sgd", False, ("overlap", "sync")),
    "amp-fp16": ("mlp", "amp", "sgd", False, ("sync",)),
    "clip": ("mlp", "clip", "sgd", False, ("sync",)),
}


def _batches(kind: str, rank: int, device: torch.device, steps: int) -> list[Any]:
    """Every (micro-)batch of a run, on the device before training starts (no copies in it)."""
    out = []
    for step in range(steps):
        micro = [loops.batch(kind, rank, step, m) for m in (0, 1)]
        out.append([(x.to(device), y.to(device)) for x, y in micro])
    return out


def train(
    module: nn.Module,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    loop: str,
    batches: list[Any],
    *,
    rank: int,
    no_sync: Callable[[], Any],
) -> list[str]:
    losses: list[str] = []
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**16, growth_interval=2)
    for step, micro in enumerate(batches):
        (x, y), (x1, y1) = micro
        opt.zero_grad()
        if loop == "accum":
            with no_sync():
                loss0 = loops.loss_of(module(x), y) / 2
                loss0.backward()  # type: ignore[no-untyped-call]
            loss = loops.loss_of(module(x1), y1) / 2
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
        elif loop == "bf16":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loops.loss_of(module(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
        elif loop == "amp":
            if step == loops.HUGE_STEP:
                x = x * 1e5  # overflows fp16: GradScaler skips this step
            with torch.autocast("cuda", dtype=torch.float16):
                loss = loops.loss_of(module(x), y)
            scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        elif loop == "clip":
            loss = loops.loss_of(module(x), y, reduction="sum")
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        elif loop in ("branch", "rank0-aux"):
            use_branch = loop == "rank0-aux" or step % 2 == 0
            out = module(x, use_branch=use_branch, use_aux=loop == "rank0-aux" and rank == 0)
            loss = loops.loss_of(out, y)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
        else:
            loss = loops.loss_of(module(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
        losses.append(float(loss).hex())
    return losses


def run_case(name: str, device: torch.device, rank: int, *, ref_twice: bool) -> None:
    model_name, loop, optimizer, unused, modes = CASES[name]
    kind = loops.inputs_of(loops.MODELS[model_name]())
    batches = _batches(kind, rank, device, STEPS)

    def reference() -> tuple[dict[str, Tensor], list[str]]:
        model = loops.build_model(model_name, seed=0).to(device)
        ddp = DDP(model, device_ids=[device], find_unused_parameters=unused)
        opt = loops.make_optimizer(optimizer, model.parameters())
        losses = train(ddp, model, opt, loop, batches, rank=rank, no_sync=ddp.no_sync)
        torch.cuda.synchronize(device)
        return loops.snapshot(model), losses

    ref, ref_losses = reference()
    repeat_equal = None
    if ref_twice:
        again, again_losses = reference()
        repeat_equal = loops.compare(ref, again)[0] and again_losses == ref_losses
    for mode in modes:
        res: dict[str, Any] = {"case": f"{name}:{mode}", "rank": rank}
        t0 = time.perf_counter()
        model = loops.build_model(model_name, seed=0).to(device)
        opt: Any = None
        try:
            schedule = None if mode == "online" else loops.make_schedule(model, cast(Any, mode))
            opt = pace.runtime.wrap(
                loops.make_optimizer(optimizer, model.parameters()),
                model,
                schedule,
                backend="torch",
                sync=mode == "sync",
                timeout_s=60.0,
            )
            losses = train(model, model, opt, loop, batches, rank=rank, no_sync=opt.no_sync)
            opt.synchronize()
            torch.cuda.synchronize(device)
            res["losses_equal"] = losses == ref_losses
        except Exception as exc:
            res["error"] = f"{type(exc).__name__}: {exc}"[:1500]
        finally:
            if opt is not None:
                opt.close()
        got = loops.snapshot(model)
        equal, max_abs, diff = loops.compare(ref, got)
        res.update(equal=equal, max_abs_diff=max_abs, diff=diff[:6])
        res["ref_repeat_equal"] = repeat_equal
        res["on_device"] = all(t.device == device for t in got.values())
        res["seconds"] = round(time.perf_counter() - t0, 3)
        host = {k: v.cpu() for k, v in got.items()}
        mine = (
            loops.digest(host),
            loops.digest(host, params_only=True),
            loops.digest({k: v.cpu() for k, v in ref.items()}),
        )
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        # Buffers (BatchNorm statistics of each rank's last batch) differ between ranks under
        # DDP too: ranks_agree must be what the reference's is, parameters must agree.
        res["ranks_agree"] = all(d[0] == everyone[0][0] for d in everyone)
        res["ranks_agree_params"] = all(d[1] == everyone[0][1] for d in everyone)
        res["ref_ranks_agree"] = all(d[2] == everyone[0][2] for d in everyone)
        res["threads_left"] = [t.name for t in threading.enumerate() if t.name.startswith("pace-")]
        print(RESULT + json.dumps(res), flush=True)


@contextmanager
def counting_syncs() -> Iterator[Counter[str]]:
    """Synchronising CUDA calls made from Python, per thread, while inside."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    old = warnings.showwarning

    def show(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
        if "synchronizing CUDA operation" in str(message):
            with lock:
                seen[threading.current_thread().name] += 1
        else:
            old(message, category, *args, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield seen
        finally:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = old


def sync_case(device: torch.device, rank: int) -> None:
    """Synchronising calls per training step: DDP vs pace (overlap, sync), same model."""
    batches = _batches("img", rank, device, 12)
    out: dict[str, Any] = {"rank": rank}
    for who in ("ddp", "pace-overlap", "pace-sync"):
        model = loops.build_model("cnn", seed=0).to(device)
        opt: Any
        if who == "ddp":
            module: nn.Module = DDP(model, device_ids=[device])
            opt = loops.make_optimizer("sgd", model.parameters())
            no_sync: Callable[[], Any] = cast(DDP, module).no_sync
        else:
            module = model
            mode = who.removeprefix("pace-")
            opt = pace.runtime.wrap(
                loops.make_optimizer("sgd", model.parameters()),
                model,
                loops.make_schedule(model, cast(Any, mode)),
                backend="torch",
                sync=mode == "sync",
            )
            no_sync = opt.no_sync
        train(module, model, opt, "plain", batches[:4], rank=rank, no_sync=no_sync)  # warm-up
        if who != "ddp":
            opt.synchronize()
        torch.cuda.synchronize(device)
        with counting_syncs() as seen:
            for x_y in batches[4:]:
                (x, y), _ = x_y
                opt.zero_grad()
                loss = loops.loss_of(module(x), y)
                loss.backward()  # type: ignore[no-untyped-call]
                opt.step()
            if who != "ddp":
                opt.synchronize()
        torch.cuda.synchronize(device)
        out[who] = dict(seen)
        out[f"{who}:steps"] = len(batches) - 4
        if who != "ddp":
            opt.close()
    print(SYNC + json.dumps(out), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["gloo", "nccl"], required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--ref-twice", action="store_true")
    ap.add_argument("--syncdebug", action="store_true")
    args = ap.parse_args()
    # Bitwise comparisons need deterministic kernels (cuDNN's backward may use atomics).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group(args.backend, timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    for name in [c for c in args.cases.split(",") if c]:
        run_case(name, device, rank, ref_twice=args.ref_twice)
    if args.syncdebug:
        sync_case(device, rank)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
