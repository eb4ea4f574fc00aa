"""Multi-process worker for tests/test_runtime_loops.py: the training loops users really write.

Launched once per backend, by ``torchrun --nproc-per-node 2`` (``--backend torch``) or
``horovodrun -np 2 -H localhost:2 --gloo`` (``--backend horovod``); both ranks run every requested
case, one after the other, in the same two processes. A case is a model, an optimizer and a
training loop (clipping, GradScaler, gradient accumulation, unused parameters, BatchNorm, ...).
For each case the worker runs the reference once (DDP over gloo, or ``hvd.DistributedOptimizer``
with Horovod's documented patterns), then pace once per requested mode (``overlap`` or ``sync``)
from the same initial state and data, and prints one line per rank and (case, mode)::

    PACE_RESULT {"case": "clip:sync", "rank": 0, "equal": true, "ranks_agree": true, ...}

``equal``: every parameter and buffer bitwise equal to the reference on this rank;
``ranks_agree``: this rank's final parameters and buffers equal rank 0's; ``error``: what the pace
run raised (``"TypeName: message"``), only when it raised. A case that raises on a rank is
reported and both ranks meet again before the next case; if they cannot (a broken process group)
or a case does not finish in time, the rank prints ``PACE_ABORT {json}`` and exits with status 3.

``--die-rank R --die-at S`` (the failing-rank test): no reference; rank R raises
``ValueError("corrupt batch S")`` in its training loop at step S and lets it propagate, as a
user's script would; the other rank prints its result as soon as pace raises.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import functools
import hashlib
import io
import json
import math
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import torch
from torch import Tensor, nn
from torch.nn import functional

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))  # the repository, when run as a script

from pace.ir import CommModel, Schedule, Slice, Unit  # noqa: E402

Backend = Literal["torch", "horovod"]
Mode = Literal["overlap", "sync"]
Who = Literal["ref", "pace"]

RESULT = "PACE_RESULT "
ABORT = "PACE_ABORT "
STEPS = 8
BATCH = 8
WIDTH = 16
CLASSES = 10
VOCAB = 32
SEQ = 6
LR = 0.05
HUGE_STEP = 3  # amp cases: inputs x 1e5 at this step overflow fp16, so GradScaler skips it
EVAL_AT = 3  # bn cases: an eval forward under no_grad after this step (and after the last)
RESUME_AT = 4  # onecycle-resume: checkpoint after this many steps, resume in a fresh run
MAX_LINE = 3500  # keep every printed line below PIPE_BUF: ranks share one pipe


# ---------------------------------------------------------------------------------------------
# Models and data (deterministic: a model is built from a seed, a batch from rank and step)


class MLP(nn.Module):
    inputs = "vec"

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = functional.relu(self.fc1(x))
        x = functional.relu(self.fc2(x))
        out: Tensor = self.fc3(x)
        return out


class CNN(nn.Module):
    inputs = "img"

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.conv2 = nn.Conv2d(4, 8, 3)
        self.fc1 = nn.Linear(8 * 8 * 8, 32)
        self.fc2 = nn.Linear(32, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = functional.relu(self.conv1(x))
        x = functional.relu(self.conv2(x))
        x = functional.relu(self.fc1(x.flatten(1)))
        out: Tensor = self.fc2(x)
        return out


class BranchNet(nn.Module):
    """``branch`` and ``aux`` take part only when the loop says so (data-dependent graphs)."""

    inputs = "vec"

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(WIDTH, 32)
        self.branch = nn.Linear(32, 32)
        self.aux = nn.Linear(32, CLASSES)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x: Tensor, use_branch: bool = True, use_aux: bool = True) -> Tensor:
        h = functional.relu(self.trunk(x))
        if use_branch:
            h = h + functional.relu(self.branch(h))
        out: Tensor = self.head(h)
        if use_aux:
            out = out + self.aux(h)
        return out


class BNNet(nn.Module):
    inputs = "img"

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 10 * 10, 16)
        self.bn1d = nn.BatchNorm1d(16)
        self.out = nn.Linear(16, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        x = functional.relu(self.bn(self.conv(x)))
        x = functional.relu(self.bn1d(self.fc(x.flatten(1))))
        out: Tensor = self.out(x)
        return out


class TiedLM(nn.Module):
    """An embedding and the output layer share one weight (``out.weight is emb.weight``)."""

    inputs = "tok"

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.mid = nn.Linear(16, 16)
        self.out = nn.Linear(16, VOCAB, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, tokens: Tensor) -> Tensor:
        out: Tensor = self.out(torch.tanh(self.mid(self.emb(tokens))))
        return out


class ReadsAhead(nn.Module):
    """The parent reads its last layer's bias and weight before calling that layer: reads that
    the layer's own forward pre-hook does not cover (pace.runtime.reads waits at them)."""

    inputs = "vec"

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, 32)
        self.fc2 = nn.Linear(32, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        h = functional.relu(self.fc1(x))
        gate = torch.sigmoid(self.fc2.bias.sum() + self.fc2.weight.mean())
        out: Tensor = self.fc2(h * gate)
        return out


class HalfMLP(nn.Module):
    """A float16 model (``.half()``: float16 gradients). Its small gradients are subnormal, where
    halving rounds: the average is DDP's bits only if each gradient is divided before the sum,
    as DDP does, and Horovod's only if the sum is divided, as Horovod does."""

    inputs = "vec"

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, 32)
        self.fc2 = nn.Linear(32, CLASSES)
        self.half()

    def forward(self, x: Tensor) -> Tensor:
        h = functional.relu(self.fc1(x.half()))
        # Small logits, so that most gradients are below float16's smallest normal (6e-5).
        out: Tensor = self.fc2(h) * 1e-3
        return out


class MixedMLP(nn.Module):
    """Layers kept in three precisions: float16, bfloat16, float16 again and a float32 head
    (float16 and bfloat16 have one element size: only the dtype tells them apart)."""

    inputs = "vec"

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, 32).half()
        self.fc2 = nn.Linear(32, 32).bfloat16()
        self.fc3 = nn.Linear(32, 32).half()
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        h = functional.relu(self.fc1(x.half()))
        h = functional.relu(self.fc2(h.bfloat16()))
        h = functional.relu(self.fc3(h.half()))
        out: Tensor = self.head(h.float())
        return out


def _frozen_mlp() -> nn.Module:
    model = MLP()
    model.fc2.requires_grad_(False)  # a frozen layer in the middle: gradients flow through it
    return model


MODELS: dict[str, Callable[[], nn.Module]] = {
    "mlp": MLP,
    "cnn": CNN,
    "branch": BranchNet,
    "bn": BNNet,
    "tied": TiedLM,
    "frozen": _frozen_mlp,
    "reads-ahead": ReadsAhead,
    "half": HalfMLP,
    "mixed": MixedMLP,
}


def build_model(name: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = MODELS[name]()
    with torch.no_grad():
        for b in model.buffers():  # buffers differ by seed too (BatchNorm's start equal)
            b.add_(seed)
    return model


def inputs_of(model: nn.Module) -> str:
    return str(getattr(model, "inputs", "vec"))


def batch(kind: str, rank: int, step: int, micro: int = 0) -> tuple[Tensor, Tensor]:
    """Rank ``rank``'s (micro-)batch of ``step``; ``rank=-1``: the same on every rank."""
    g = torch.Generator().manual_seed(1_000_003 * (rank + 2) + 1009 * step + micro)
    if kind == "img":
        return torch.randn(BATCH, 1, 12, 12, generator=g), torch.randint(
            0, CLASSES, (BATCH,), generator=g
        )
    if kind == "tok":
        t = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
        return t[:, :-1], t[:, 1:]
    return torch.randn(BATCH, WIDTH, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


def loss_of(out: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    return functional.cross_entropy(
        out.reshape(-1, out.shape[-1]).float(), y.reshape(-1), reduction=reduction
    )


def make_optimizer(kind: str, params: Any) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=1e-4)
    if kind == "adam":
        return torch.optim.Adam(params, lr=LR / 10, weight_decay=1e-4)
    raise ValueError(kind)


def make_schedule(model: nn.Module, mode: Mode) -> Schedule:
    """A schedule with partitions and fusion groups for any model, from its parameter names.

    Trainable tensors in reverse registration order (roughly backward order); the largest is
    split in two (its first half alone, its second half fused with the next tensor); the others
    are fused in pairs. Units are listed in reverse priority order: the runtime must sort them.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad][::-1]
    largest = max(named, key=lambda item: item[1].numel())[0]
    groups: list[list[Slice]] = []
    pending: list[Slice] = []
    for name, p in named:
        size = p.numel() * p.element_size()
        if name == largest and p.numel() >= 2:
            half = p.numel() // 2 * p.element_size()
            groups.append([Slice(tensor=name, offset_bytes=0, size_bytes=half)])
            pending.append(Slice(tensor=name, offset_bytes=half, size_bytes=size - half))
        else:
            pending.append(Slice(tensor=name, offset_bytes=0, size_bytes=size))
        if len(pending) == 2:
            groups.append(pending)
            pending = []
    if pending:
        groups.append(pending)
    units = [Unit(priority=k, slices=tuple(g)) for k, g in enumerate(groups)]
    # "overlap" is the default: leave the field out, as in every schedule file written before it.
    extra: dict[str, Any] = {} if mode == "overlap" else {"mode": mode}
    return Schedule(
        trace_digest="sha256:loops",
        cost_model=CommModel(workers=2, alpha_us=10.0, beta_us_per_byte=0.001),
        units=tuple(reversed(units)),
        predicted_iteration_us=0.0,
        **extra,
    )


def profiled_schedule(model: nn.Module, mode: Mode) -> Schedule:
    """What ``pace profile`` then ``pace compile`` give for ``model``, the same on every rank:
    the profiled op graph and tensors (their dtypes too) with every op's duration set to 100 us
    (measured ones differ between ranks, and so would the schedules), on a link whose per-call
    cost makes the compiler fuse all it may."""
    import copy

    from pace.compiler import compile_trace
    from pace.profiler import profile

    x, y = batch(inputs_of(model), -1, 0)
    trace = profile(
        copy.deepcopy(model),
        lambda m: functional.cross_entropy(m(x), y),
        iters=1,
        warmup=1,
        calibrate=0,
        comm=CommModel(workers=2, alpha_us=1e5, beta_us_per_byte=0.001),
    )
    trace = dataclasses.replace(
        trace, ops=tuple(dataclasses.replace(op, duration_us=100.0) for op in trace.ops)
    )
    return compile_trace(trace, mode=mode).schedule


def forward_order_schedule(model: nn.Module, mode: Mode) -> Schedule:
    """One unit per tensor, in forward (registration) order: PACE's priorities, where the last
    layers' updates land last, after the first layers' forwards have started."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    units = tuple(
        Unit(
            priority=k,
            slices=(Slice(tensor=n, offset_bytes=0, size_bytes=p.numel() * p.element_size()),),
        )
        for k, (n, p) in enumerate(named)
    )
    return dataclasses.replace(make_schedule(model, mode), units=units)


# ---------------------------------------------------------------------------------------------
# Cases


@dataclass(frozen=True)
class Case:
    model: str
    loop: str = "plain"
    optimizer: str = "sgd"
    unused: bool = False  # the reference is DDP(find_unused_parameters=True)
    seed_by_rank: bool = (
        False  # each rank builds other weights; DDP / hvd / wrap broadcast rank 0's
    )
    compiled: bool = False  # torch.compile(model, backend="aot_eager")
    broadcast_buffers: bool | None = None  # pace's knob; the reference: DDP's / a DDP-rule wrapper
    # compiled: make_schedule's; profiled: profiled_schedule's (pace profile, pace compile)
    schedule: Literal["compiled", "online", "wrong-mode", "forward-order", "profiled"] = "compiled"
    pace_horovod_style: bool | None = None  # pace's loop in Horovod's pattern; None: as the ref's
    reference: bool = True
    framework: bool = False  # pace wraps a schedule file marked framework="horovod"
    # pace's random delays in its hooks and threads (wrap's inject_delay_s): updates still in
    # flight when the forward starts, so that a read ahead of a module races them
    inject_delay_s: float = 0.0


CASES: dict[str, Case] = {
    "sgd": Case("cnn"),
    "adam": Case("cnn", optimizer="adam"),
    "online-sgd": Case("cnn", schedule="online"),
    "clip": Case("mlp", loop="clip"),
    "clip-horovod-style": Case("mlp", loop="clip", pace_horovod_style=True),
    "amp-fp16": Case("mlp", loop="amp"),
    "amp-fp16-clip": Case("mlp", loop="amp-clip"),
    "amp-fp16-noskip": Case("mlp", loop="amp-noskip"),
    "accum": Case("mlp", loop="accum"),
    "unused-branch-sgd": Case("branch", loop="branch", unused=True),
    "unused-branch-adam": Case("branch", loop="branch", optimizer="adam", unused=True),
    "unused-rank0": Case("branch", loop="rank0-aux", unused=True),
    "bn": Case("bn", loop="bn"),
    "bn-no-broadcast": Case("bn", loop="bn", broadcast_buffers=False),
    "bn-broadcast": Case("bn", loop="bn", broadcast_buffers=True),
    "seeds": Case("mlp", seed_by_rank=True),
    "compile": Case("mlp", compiled=True),
    "bf16": Case("mlp", loop="bf16"),
    "fp16-model": Case("half"),
    "mixed-dtypes": Case("mixed", schedule="profiled"),
    # Horovod: the same model refused at wrap (Horovod reduces no bfloat16 on the CPU).
    "mixed-dtypes-refused": Case("mixed", schedule="profiled", reference=False),
    "ema": Case("mlp", loop="ema"),
    "tied": Case("tied"),
    "frozen": Case("frozen"),
    "reads-ahead": Case("reads-ahead", schedule="forward-order", inject_delay_s=0.002),
    "onecycle-resume": Case("mlp", loop="onecycle"),
    "sync-mismatch": Case("mlp", schedule="wrong-mode", reference=False),
    "sgd-after-errors": Case("cnn"),  # run last: the refused runs above must leave nothing behind
    # Horovod only: the schedule marks Horovod's own path (Schedule.framework); pace trains with
    # hvd.DistributedOptimizer. DDP's loop (no synchronize()) in the sync mode: backward()
    # returns reduced; "-horovod-style": synchronize(); ...; with skip_synchronize(): step().
    "fw-sgd": Case("cnn", framework=True),
    "fw-clip": Case("mlp", loop="clip", framework=True, pace_horovod_style=False),
    "fw-clip-horovod-style": Case("mlp", loop="clip", framework=True),
    "fw-amp-fp16-clip": Case("mlp", loop="amp-clip", framework=True, pace_horovod_style=False),
    "fw-accum": Case("mlp", loop="accum", framework=True),
    "fw-bn-seeds": Case("bn", loop="bn", seed_by_rank=True, framework=True),
    "fw-bn-broadcast": Case("bn", loop="bn", broadcast_buffers=True, framework=True),
    "fw-compile": Case("mlp", compiled=True, framework=True, pace_horovod_style=False),
    "fw-onecycle-resume": Case("mlp", loop="onecycle", framework=True),
    "fw-step-in-no-sync": Case("mlp", loop="step-in-no-sync", framework=True, reference=False),
}


# ---------------------------------------------------------------------------------------------
# One training run and the loops


class HorovodStyleOptimizer(Protocol):
    def synchronize(self) -> None: ...
    def skip_synchronize(self) -> AbstractContextManager[None]: ...


class PaceOptimizer(HorovodStyleOptimizer, Protocol):
    def no_sync(self) -> AbstractContextManager[None]: ...
    def close(self) -> None: ...


def _nothing() -> None:
    return None


@dataclass
class Run:
    """What a loop trains: ``module`` is called (DDP wrapper, compiled module or the model)."""

    module: nn.Module
    model: nn.Module  # the plain model: parameters and buffers under their own names
    opt: torch.optim.Optimizer
    no_sync: Callable[[], AbstractContextManager[Any]]
    horovod_style: bool  # synchronize(); edit gradients; with skip_synchronize(): step()
    rebuild: Callable[[dict[str, Any]], Run]  # a fresh model and optimizer from a checkpoint
    close: Callable[[], None] = _nothing
    finish: Callable[[], None] = _nothing  # wait for every update (pace: synchronize())


@dataclass
class Session:
    run: Run
    rank: int
    steps: int = STEPS
    die_at: int = -1
    resume_at: int = -1


def _hex(x: Tensor | float) -> str:
    return float(x).hex()


def _step(run: Run, edit: Callable[[], None] | None, step: Callable[[], Any]) -> None:
    """Edit the gradients (clip, unscale) and step, as the user writes it for the backend."""
    if run.horovod_style:
        opt = cast(HorovodStyleOptimizer, run.opt)
        opt.synchronize()
        if edit is not None:
            edit()
        with opt.skip_synchronize():
            step()
    else:
        if edit is not None:
            edit()
        step()


def _check_die(s: Session, step: int) -> None:
    if step == s.die_at:
        raise ValueError(f"corrupt batch {step}")


def _plain_step(s: Session, step: int) -> Tensor:
    """One iteration of the plain loop on this rank's batch of ``step``; its loss."""
    run = s.run
    x, y = batch(inputs_of(run.model), s.rank, step)
    run.opt.zero_grad()
    loss = loss_of(run.module(x), y)
    loss.backward()  # type: ignore[no-untyped-call]
    run.opt.step()
    return loss


def loop_plain(s: Session) -> dict[str, Any]:
    losses = []
    for step in range(s.steps):
        _check_die(s, step)
        losses.append(_hex(_plain_step(s, step)))
    return {"losses": losses}


def loop_ema(s: Session) -> dict[str, Any]:
    """Reads right after ``step()``, outside the model's forward, while the overlapped mode's
    updates are in flight: an EMA of the weights (``torch.optim.swa_utils``), the gradients'
    norm, a copy of the weights."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    run = s.run
    ema = AveragedModel(run.model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    norms, copies = [], []
    for step in range(s.steps):
        _plain_step(s, step)
        ema.update_parameters(run.model)
        grads = [p.grad for p in run.model.parameters() if p.grad is not None]
        norms.append(_hex(torch.stack([g.norm() for g in grads]).norm()))
        copies.append(digest({n: p.data.clone() for n, p in run.model.named_parameters()}))
    averaged = {n: p.detach() for n, p in ema.module.named_parameters()}
    return {"ema": digest(averaged), "grad_norms": norms, "copies": copies}


def loop_bf16(s: Session) -> dict[str, Any]:
    losses = []
    run = s.run
    for step in range(s.steps):
        x, y = batch(inputs_of(run.model), s.rank, step)
        run.opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_of(run.module(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        run.opt.step()
        losses.append(_hex(loss))
    return {"losses": losses}


def loop_clip(s: Session) -> dict[str, Any]:
    losses, norms = [], []
    run = s.run

    def clip() -> None:
        norms.append(_hex(torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)))

    for step in range(s.steps):
        x, y = batch(inputs_of(run.model), s.rank, step)
        run.opt.zero_grad()
        loss = loss_of(run.module(x), y, reduction="sum")  # large gradients: clipping acts
        loss.backward()  # type: ignore[no-untyped-call]
        _step(run, clip, run.opt.step)
        losses.append(_hex(loss))
    return {"losses": losses, "norms": norms}


def loop_amp(s: Session, *, clip: bool, huge: bool = True) -> dict[str, Any]:
    """fp16 autocast on the CPU with a GradScaler; one batch of huge inputs forces a skip
    (``huge``; without it no step is skipped: the scale only grows)."""
    losses, scales = [], []
    run = s.run
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=2)

    def unscale_and_clip() -> None:
        scaler.unscale_(run.opt)
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)

    for step in range(s.steps):
        x, y = batch(inputs_of(run.model), s.rank, step)
        if huge and step == HUGE_STEP:
            x = x * 1e5
        run.opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = loss_of(run.module(x), y)
        scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        _step(run, unscale_and_clip if clip else None, lambda: scaler.step(run.opt))
        scaler.update()
        losses.append(_hex(loss))
        scales.append(scaler.get_scale())
    return {"losses": losses, "scales": scales}


def loop_accum(s: Session) -> dict[str, Any]:
    """Two micro-batches per step, the first under no_sync() (forward and backward inside)."""
    losses = []
    run = s.run
    for step in range(s.steps):
        run.opt.zero_grad()
        for micro in (0, 1):
            x, y = batch(inputs_of(run.model), s.rank, step, micro)
            with run.no_sync() if micro == 0 else nullcontext():
                loss = loss_of(run.module(x), y) / 2
                loss.backward()  # type: ignore[no-untyped-call]
            losses.append(_hex(loss))
        run.opt.step()
    return {"losses": losses}


def loop_step_in_no_sync(s: Session) -> dict[str, Any]:
    """A misuse: step() inside no_sync(), on the gradients accumulated there (refused)."""
    run = s.run
    for step in range(s.steps):
        run.opt.zero_grad()
        x, y = batch(inputs_of(run.model), s.rank, step)
        with run.no_sync():
            loss_of(run.module(x), y).backward()  # type: ignore[no-untyped-call]
            run.opt.step()
    return {}


def loop_branch(s: Session, *, rank0_aux: bool) -> dict[str, Any]:
    """``branch`` on even steps only (unused on every rank on odd steps); ``aux`` on rank 0 only
    (``rank0_aux``) or never."""
    losses = []
    run = s.run
    for step in range(s.steps):
        x, y = batch(inputs_of(run.model), s.rank, step)
        run.opt.zero_grad()
        use_branch = rank0_aux or step % 2 == 0
        out = run.module(x, use_branch=use_branch, use_aux=rank0_aux and s.rank == 0)
        loss = loss_of(out, y)
        loss.backward()  # type: ignore[no-untyped-call]
        run.opt.step()
        losses.append(_hex(loss))
    return {"losses": losses}


def loop_bn(s: Session) -> dict[str, Any]:
    """Training with BatchNorm, an eval forward under no_grad mid-training and at the end (the
    same eval batch on every rank)."""
    losses, evals = [], []
    run = s.run
    xe, ye = batch(inputs_of(run.model), -1, 0)
    for step in range(s.steps):
        losses.append(_hex(_plain_step(s, step)))
        if step in (EVAL_AT, s.steps - 1):
            run.module.eval()
            with torch.no_grad():
                evals.append(_hex(loss_of(run.module(xe), ye)))
            run.module.train()
    return {"losses": losses, "eval_losses": evals}


def _checkpoint(run: Run, sched: torch.optim.lr_scheduler.LRScheduler) -> dict[str, Any]:
    buf = io.BytesIO()
    torch.save(
        {
            "model": run.model.state_dict(),
            "opt": run.opt.state_dict(),
            "sched": sched.state_dict(),
        },
        buf,
    )
    buf.seek(0)
    ckpt: dict[str, Any] = torch.load(buf, weights_only=False)
    return ckpt


def loop_onecycle(s: Session) -> dict[str, Any]:
    """OneCycleLR; with ``resume_at``: checkpoint (model, optimizer, scheduler) after that many
    steps, close the run, build a fresh model and optimizer, load the checkpoint and go on."""
    losses = []

    def scheduler(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.OneCycleLR:
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=s.steps)

    sched = scheduler(s.run.opt)
    for step in range(s.steps):
        if step == s.resume_at:
            ckpt = _checkpoint(s.run, sched)
            s.run.close()
            s.run = s.run.rebuild(ckpt)
            sched = scheduler(s.run.opt)
            s.run.opt.load_state_dict(ckpt["opt"])
            sched.load_state_dict(ckpt["sched"])
        loss = _plain_step(s, step)
        sched.step()
        losses.append(_hex(loss))
    return {"losses": losses}


LOOPS: dict[str, Callable[[Session], dict[str, Any]]] = {
    "plain": loop_plain,
    "bf16": loop_bf16,
    "ema": loop_ema,
    "clip": loop_clip,
    "amp": functools.partial(loop_amp, clip=False),
    "amp-clip": functools.partial(loop_amp, clip=True),
    "amp-noskip": functools.partial(loop_amp, clip=False, huge=False),
    "accum": loop_accum,
    "step-in-no-sync": loop_step_in_no_sync,
    "branch": functools.partial(loop_branch, rank0_aux=False),
    "rank0-aux": functools.partial(loop_branch, rank0_aux=True),
    "bn": loop_bn,
    "onecycle": loop_onecycle,
}


# ---------------------------------------------------------------------------------------------
# Building the reference and the pace runs


@dataclass(frozen=True)
class Env:
    backend: Backend
    rank: int
    timeout_s: float


class DdpBufferRule(nn.Module):
    """DDP's ``broadcast_buffers=True`` for a Horovod reference: before a forward, rank 0's
    buffers are copied to every rank iff the previous forward ran with gradients enabled (DDP's
    ``require_forward_param_sync``; initially true). No ``no_sync`` here."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self._sync_next = True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._sync_next:
            import horovod.torch as hvd

            with torch.no_grad():
                for i, b in enumerate(self.module.buffers()):
                    hvd.broadcast_(b, root_rank=0, name=f"ref.buffer.{i}")
        self._sync_next = torch.is_grad_enabled()
        return self.module(*args, **kwargs)


def _compile(module: nn.Module) -> nn.Module:
    return cast(nn.Module, torch.compile(module, backend="aot_eager"))


def make_run(
    case: Case,
    env: Env,
    who: Who,
    mode: Mode,
    *,
    alt: bool = False,
    ckpt: dict[str, Any] | None = None,
) -> Run:
    """A fresh model (from the seed, or from ``ckpt``) and optimizer, wrapped as ``who`` does.

    ``alt`` (reference only, for ``--ref-twice``): Horovod accumulation by hand (local
    accumulation, then one ``hvd.allreduce_`` per gradient) instead of backward_passes_per_step.
    """
    model = build_model(case.model, env.rank if case.seed_by_rank else 0)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])

    def rebuild(c: dict[str, Any]) -> Run:
        return make_run(case, env, who, mode, alt=alt, ckpt=c)

    if who == "pace":
        return _pace_run(case, env, mode, model, rebuild)
    if env.backend == "torch":
        from torch.nn.parallel import DistributedDataParallel

        inner = _compile(model) if case.compiled else model
        ddp = DistributedDataParallel(
            inner,
            find_unused_parameters=case.unused,
            broadcast_buffers=case.broadcast_buffers is not False,
        )
        opt = make_optimizer(case.optimizer, model.parameters())
        return Run(ddp, model, opt, ddp.no_sync, horovod_style=False, rebuild=rebuild)
    import horovod.torch as hvd

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    module = _compile(model) if case.compiled else model
    if case.broadcast_buffers:
        module = DdpBufferRule(module)
    base = make_optimizer(case.optimizer, model.parameters())
    if alt and case.loop == "accum":
        opt_alt = _allreduce_then_step(base, model)
        return Run(module, model, opt_alt, nullcontext, horovod_style=False, rebuild=rebuild)
    opt = hvd.DistributedOptimizer(
        base,
        named_parameters=model.named_parameters(),
        backward_passes_per_step=2 if case.loop == "accum" else 1,
    )
    return Run(module, model, opt, nullcontext, horovod_style=True, rebuild=rebuild)


def _allreduce_then_step(opt: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
    """``opt`` whose step() first averages every local gradient with ``hvd.allreduce_``."""
    import horovod.torch as hvd

    plain_step = opt.step

    def step(*args: Any, **kwargs: Any) -> Any:
        for name, p in model.named_parameters():
            if p.grad is not None:
                hvd.allreduce_(p.grad, op=hvd.Average, name=f"alt.{name}")
        return plain_step(*args, **kwargs)

    opt.step = step  # type: ignore[method-assign]
    return opt


def _pace_run(
    case: Case, env: Env, mode: Mode, model: nn.Module, rebuild: Callable[[dict[str, Any]], Run]
) -> Run:
    import pace.runtime

    module = _compile(model) if case.compiled else model
    schedule: Schedule | str | None = None
    if case.schedule == "compiled":
        schedule = make_schedule(model, mode)
    elif case.schedule == "forward-order":
        schedule = forward_order_schedule(model, mode)
    elif case.schedule == "profiled":
        schedule = profiled_schedule(model, mode)
    elif case.schedule == "wrong-mode":
        schedule = make_schedule(model, "overlap" if mode == "sync" else "sync")
    with tempfile.TemporaryDirectory() as tmp:
        if case.framework:
            from pace.io import save_schedule

            assert isinstance(schedule, Schedule)
            path = os.path.join(tmp, "framework.schedule.json")
            save_schedule(dataclasses.replace(schedule, framework="horovod"), path)
            schedule = path
        opt = pace.runtime.wrap(
            make_optimizer(case.optimizer, model.parameters()),
            module,
            schedule,
            backend=env.backend,
            sync=mode == "sync",
            broadcast_buffers=case.broadcast_buffers,
            timeout_s=env.timeout_s,
            inject_delay_s=case.inject_delay_s,
        )
    popt = cast(PaceOptimizer, opt)
    style = env.backend == "horovod" if case.pace_horovod_style is None else case.pace_horovod_style
    return Run(
        module,
        model,
        opt,
        popt.no_sync,
        horovod_style=style,
        rebuild=rebuild,
        close=popt.close,
        finish=popt.synchronize,
    )


# ---------------------------------------------------------------------------------------------
# Executing runs, comparing, reporting


def snapshot(model: nn.Module) -> dict[str, Tensor]:
    """Parameters, buffers and the gradients the last step left (the averages: a user may read
    them after step(), e.g. to log their norm)."""
    state = {f"param:{n}": p.detach().clone() for n, p in model.named_parameters()}
    state.update({f"buffer:{n}": b.detach().clone() for n, b in model.named_buffers()})
    state.update(
        {f"grad:{n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    )
    return state


def digest(state: dict[str, Tensor], *, params_only: bool = False) -> str:
    h = hashlib.sha256()
    for key in sorted(state):
        if params_only and not key.startswith("param:"):
            continue
        t = state[key].contiguous().reshape(-1)
        h.update(f"{key}:{t.dtype}:".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def compare(ref: dict[str, Tensor], got: dict[str, Tensor]) -> tuple[bool, float, list[str]]:
    """(bitwise equal, max |difference|, the differing names)."""
    if ref.keys() != got.keys():
        return False, math.inf, sorted(set(ref) ^ set(got))
    diff = [k for k in ref if ref[k].dtype != got[k].dtype or not torch.equal(ref[k], got[k])]
    max_abs = 0.0
    for k in diff:
        d = (ref[k].double() - got[k].double()).abs().max().item() if ref[k].numel() else 0.0
        max_abs = max(max_abs, d) if not math.isnan(d) else math.nan
    return not diff, max_abs, diff


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1200]


@dataclass
class Outcome:
    initial: dict[str, Tensor] = field(default_factory=dict)
    final: dict[str, Tensor] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    close_error: str | None = None
    graphs: int | None = None
    breaks: int | None = None
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    skip_sync_warnings: int = 0  # Horovod's "step() called without skip_synchronize()"
    allreduces: int | None = None  # all-reduces issued by hvd.DistributedOptimizer (Horovod)
    threads_after_close: list[str] = field(default_factory=list)


class HorovodOptimizerCalls:
    """Counts the all-reduces ``hvd.DistributedOptimizer`` issues (a gradient reduced twice
    leaves the same bits with 2 ranks; the count shows it)."""

    def __init__(self, backend: Backend) -> None:
        self.count: int | None = None
        self._module: Any = None
        if backend == "horovod":
            import horovod.torch.optimizer as module

            self._module, self.count = module, 0

    def __enter__(self) -> HorovodOptimizerCalls:
        if self._module is not None:
            plain = self._module.allreduce_async_

            def counted(*args: Any, **kwargs: Any) -> Any:
                self.count = (self.count or 0) + 1
                return plain(*args, **kwargs)

            self._plain = plain
            self._module.allreduce_async_ = counted
        return self

    def __exit__(self, *_: object) -> None:
        if self._module is not None:
            self._module.allreduce_async_ = self._plain


def execute(
    case: Case,
    env: Env,
    who: Who,
    mode: Mode,
    *,
    alt: bool = False,
    die_at: int = -1,
    on_error: Callable[[Outcome], None] | None = None,
) -> Outcome:
    """One training run; what pace raises is recorded (``die_at`` >= 0: re-raised instead)."""
    from torch._dynamo.utils import counters

    out = Outcome()
    if case.compiled:
        torch._dynamo.reset()
        counters.clear()
    t0 = time.perf_counter()
    session: Session | None = None
    calls = HorovodOptimizerCalls(env.backend)
    with warnings.catch_warnings(record=True) as caught, calls:
        warnings.simplefilter("always")
        try:
            run = make_run(case, env, who, mode, alt=alt)
            out.initial = snapshot(run.model)
            session = Session(
                run,
                env.rank,
                die_at=die_at,
                resume_at=RESUME_AT if case.loop == "onecycle" and (who == "pace" or alt) else -1,
            )
            out.extras = LOOPS[case.loop](session)
            session.run.finish()
        except Exception as exc:
            if die_at >= 0:
                raise  # the dying rank: as an uncaught error in a user's script
            out.error = _err(exc)
            if on_error is not None:
                out.seconds = time.perf_counter() - t0
                on_error(out)
    out.seconds = time.perf_counter() - t0
    out.warnings = [str(w.message)[:300] for w in caught][:3]
    out.skip_sync_warnings = sum("skip_synchronize" in str(w.message) for w in caught)
    out.allreduces = calls.count
    if case.compiled:
        out.graphs = int(counters["stats"]["unique_graphs"])
        out.breaks = int(sum(counters["graph_break"].values()))
    if session is not None:
        try:
            session.run.close()
        except Exception as exc:
            out.close_error = _err(exc)
        out.final = snapshot(session.run.model)
    out.threads_after_close = [t.name for t in threading.enumerate() if t.name.startswith("pace-")]
    return out


class Comm:
    """Collectives of the harness itself (on the default group / Horovod's global set)."""

    def __init__(self, backend: Backend, barrier_timeout_s: float) -> None:
        self.backend = backend
        self.barrier_timeout_s = barrier_timeout_s

    def allgather(self, obj: Any) -> list[Any]:
        if self.backend == "horovod":
            import horovod.torch as hvd

            return list(hvd.allgather_object(obj))
        import torch.distributed as dist

        dist.monitored_barrier(timeout=timedelta(seconds=self.barrier_timeout_s))
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out


def emit(marker: str, obj: dict[str, Any]) -> None:
    line = marker + json.dumps(obj)
    if len(line) > MAX_LINE:  # drop the bulky fields rather than tear a line on the shared pipe
        obj = {k: v for k, v in obj.items() if k not in ("extras_ref", "extras_pace", "warnings")}
        obj["truncated"] = True
        line = marker + json.dumps(obj)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Watchdog:
    """Ends the process (PACE_ABORT, stacks on stderr, exit 3) when a case outlives its budget."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._what = ""
        threading.Thread(target=self._loop, name="loops-watchdog", daemon=True).start()

    def arm(self, what: str, seconds: float) -> None:
        with self._lock:
            self._what, self._deadline = what, time.monotonic() + seconds

    def disarm(self) -> None:
        with self._lock:
            self._deadline = None

    def _loop(self) -> None:
        while True:
            time.sleep(0.5)
            with self._lock:
                late = self._deadline is not None and time.monotonic() > self._deadline
                what = self._what
            if late:
                emit(ABORT, {"case": what, "rank": self.rank, "reason": "did not finish in time"})
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                sys.stderr.flush()
                os._exit(3)


def run_case(name: str, modes: list[Mode], env: Env, comm: Comm, *, ref_twice: bool) -> bool:
    """Every mode of one case; False when the ranks could not meet again afterwards."""
    case = CASES[name]
    ref: Outcome | None = None
    repeat_equal: bool | None = None
    if case.reference:
        ref = execute(case, env, "ref", "overlap")
        if ref_twice:  # determinism (and the alternative reference where there is one)
            again = execute(case, env, "ref", "overlap", alt=True)
            repeat_equal = compare(ref.final, again.final)[0] and ref.extras == again.extras
    for mode in modes:
        pace = execute(case, env, "pace", mode)
        res: dict[str, Any] = {"case": f"{name}:{mode}", "rank": env.rank}
        if pace.error is not None:
            res["error"] = pace.error
        if pace.close_error is not None:
            res["close_error"] = pace.close_error
        if ref is not None:
            if ref.error is not None:
                res["ref_error"] = ref.error
            equal, max_abs, diff = compare(ref.final, pace.final)
            res.update(equal=equal, max_abs_diff=max_abs, diff=diff[:6])
            res["extras_ref"], res["extras_pace"] = ref.extras, pace.extras
            res["graphs_ref"], res["graphs_pace"] = ref.graphs, pace.graphs
            res["breaks_ref"], res["breaks_pace"] = ref.breaks, pace.breaks
            res["seconds_ref"] = round(ref.seconds, 3)
            if repeat_equal is not None:
                res["ref_repeat_equal"] = repeat_equal
        else:
            res.update(equal=False, max_abs_diff=None)
        params = {k: v for k, v in pace.final.items() if k.startswith("param:")}
        res["moved"] = (
            bool(pace.initial)
            and not compare(
                {k: v for k, v in pace.initial.items() if k.startswith("param:")}, params
            )[0]
        )
        res["seconds_pace"] = round(pace.seconds, 3)
        res["warnings"] = pace.warnings
        res["skip_sync_warnings"] = pace.skip_sync_warnings
        if ref is not None and env.backend == "horovod":
            res["allreduces_ref"], res["allreduces_pace"] = ref.allreduces, pace.allreduces
        res["threads_after_close"] = pace.threads_after_close
        mine = (
            digest(pace.final),
            digest(pace.final, params_only=True),
            digest(ref.final) if ref is not None else "",
        )
        try:
            everyone = comm.allgather(mine)
        except Exception as exc:
            res["resync_error"] = _err(exc)
            emit(RESULT, res)
            emit(ABORT, {"case": res["case"], "rank": env.rank, "reason": res["resync_error"]})
            return False
        res["ranks_agree"] = all(d[0] == everyone[0][0] for d in everyone)
        res["ranks_agree_params"] = all(d[1] == everyone[0][1] for d in everyone)
        if ref is not None:
            res["ref_ranks_agree"] = all(d[2] == everyone[0][2] for d in everyone)
        emit(RESULT, res)
    return True


def run_dying(name: str, mode: Mode, env: Env, *, die_rank: int, die_at: int) -> None:
    """The failing-rank test: rank ``die_rank`` raises in its loop; the other reports at once."""
    case = CASES[name]

    def report(out: Outcome) -> None:
        res = {
            "case": f"{name}:{mode}",
            "rank": env.rank,
            "error": out.error,
            "seconds": round(out.seconds, 3),
        }
        emit(RESULT, res)

    out = execute(
        case, env, "pace", mode, die_at=die_at if env.rank == die_rank else -1, on_error=report
    )
    if out.error is None:  # pace did not raise: say so
        emit(RESULT, {"case": f"{name}:{mode}", "rank": env.rank, "seconds": out.seconds})


def init_backend(backend: Backend, timeout_s: float) -> int:
    if backend == "horovod":
        # Set before hvd.init(): Horovod reads them once (pace needs fusion and cache off).
        os.environ.setdefault("HOROVOD_FUSION_THRESHOLD", "0")
        os.environ.setdefault("HOROVOD_CACHE_CAPACITY", "0")
        import horovod.torch as hvd

        hvd.init()
        return int(hvd.rank())
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    return dist.get_rank()


def parse_cases(text: str) -> list[tuple[str, list[Mode]]]:
    """``a:overlap,a:sync,b:sync,a:sync`` -> (a, [overlap, sync]), (b, [sync]), (a, [sync]): the
    modes of consecutive items share one reference run; the order is kept."""
    runs: list[tuple[str, list[Mode]]] = []
    for item in text.split(","):
        name, _, mode = item.strip().partition(":")
        if name not in CASES or mode not in ("overlap", "sync"):
            raise SystemExit(f"unknown case {item!r}: name:overlap|sync, name in {sorted(CASES)}")
        if runs and runs[-1][0] == name:
            runs[-1][1].append(cast(Mode, mode))
        else:
            runs.append((name, [cast(Mode, mode)]))
    return runs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["horovod", "torch"], required=True)
    ap.add_argument("--cases", required=True, help="comma list of name:overlap|sync")
    ap.add_argument("--timeout-s", type=float, default=30.0, help="pace's timeout_s")
    ap.add_argument("--case-timeout-s", type=float, default=150.0, help="watchdog, per case")
    ap.add_argument("--ref-twice", action="store_true", help="check the reference's determinism")
    ap.add_argument("--die-rank", type=int, default=-1)
    ap.add_argument("--die-at", type=int, default=-1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    backend = cast(Backend, args.backend)
    rank = init_backend(backend, 2 * args.timeout_s + 60)
    env = Env(backend, rank, args.timeout_s)
    cases = list(parse_cases(args.cases))
    watchdog = Watchdog(rank)
    if args.die_at >= 0:
        name, modes = cases[0]
        watchdog.arm(f"{name}:{modes[0]}", args.case_timeout_s)
        run_dying(name, modes[0], env, die_rank=args.die_rank, die_at=args.die_at)
        return 0
    comm = Comm(backend, 2 * args.timeout_s + 30)
    for name, modes in cases:
        watchdog.arm(name, args.case_timeout_s)
        if not run_case(name, modes, env, comm, ref_twice=args.ref_twice):
            return 3
        watchdog.disarm()
    watchdog.arm("shutdown", 60)
    if backend == "torch":
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # The refused cases may leave a collective in flight on one rank that can never complete
    # (the other rank refused before issuing it). Every result is printed by now; exit without
    # the interpreter's finalizers, which would join gloo's worker threads blocked on it (a
    # C++ abort at exit, after the runs, that says nothing about them).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
