"""``profile(model, step_fn) -> Trace``: the profiler's one entry function."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from pace.errors import InputError
from pace.ir import CommModel, Trace
from pace.profiler.clock import Clock, clock_for
from pace.profiler.record import IterationRecord, Recorder
from pace.profiler.window import ParamInfo, Timing, build_window

StepFn = Callable[[torch.nn.Module], torch.Tensor]


def _device_of(model: torch.nn.Module) -> str:
    for p in model.parameters():
        return str(p.device)
    return "cpu"


def profile(
    model: torch.nn.Module,
    step_fn: StepFn,
    *,
    iters: int = 5,
    warmup: int = 2,
    optimizer: torch.optim.Optimizer | None = None,
    comm: CommModel | None = None,
    threads: int | None = 1,
    timing: Timing = "span",
    order_edges: bool = True,
    name: str | None = None,
    progress: bool = False,
    calibrate: int = 2,
    clock: Clock | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Trace:
    """Profile ``iters`` real training iterations of ``model`` (after ``warmup``) into a Trace.

    ``step_fn(model)`` runs the forward pass and returns the scalar loss; the profiler runs
    ``loss.backward()`` itself (that is how it finds the backward pass) and then
    ``optimizer.step()`` if an optimizer is given (its time goes to ``meta["optimizer_us"]``:
    the window of docs/trace-format.md holds forward and backward ops only). Gradients are reset
    to ``None`` before every iteration. Durations are per-op medians over the measured
    iterations.

    ``threads`` sets ``torch.set_num_threads`` for the run (1 by default: stable CPU timings on a
    shared machine; ``None`` leaves it alone). ``timing="span"`` gives each op the wall time up to
    the next op (ops add up to the measured pass time, Python overhead included);
    ``"kernel"`` only the time inside the op, as ``torch.profiler`` reports it.
    ``comm`` is the all-reduce cost model to embed (default: a ring what-if, 8 workers, 10 Gbps).
    ``progress=True`` shows a progress bar on stderr. ``calibrate`` more iterations run without
    instrumentation; their pass times go to ``meta["uninstrumented_*_us"]`` so the profiler's own
    overhead is visible (host clock; not used to rescale anything).

    Raises ``InputError`` for a model without trainable parameters, a step function that raises
    or does not return a differentiable scalar, and bad options.
    """
    if iters < 1:
        raise InputError(f"must be >= 1, got {iters}", where="profile", field="iters")
    if warmup < 0:
        raise InputError(f"must be >= 0, got {warmup}", where="profile", field="warmup")
    if timing not in ("span", "kernel"):
        raise InputError(f"must be 'span' or 'kernel', got {timing!r}", field="timing")
    if calibrate < 0:
        raise InputError(f"must be >= 0, got {calibrate}", where="profile", field="calibrate")
    if threads is not None and threads < 1:
        raise InputError(f"must be >= 1, got {threads}", where="profile", field="threads")
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        raise InputError(
            "the model has no trainable parameters: there are no gradients to all-reduce",
            where="profile",
            field="model",
        )
    device = _device_of(model)
    clk = clock if clock is not None else clock_for(device)
    if comm is None:
        from pace.profiler.comm import what_if_comm

        comm = what_if_comm(workers=8, bandwidth_gbps=10.0)

    load_before = _load_average()
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    was_training = model.training
    model.train()
    records: list[IterationRecord] = []
    try:
        from tqdm import tqdm

        bar = tqdm(
            total=warmup + iters,
            desc=f"profile {name or type(model).__name__}",
            unit="it",
            file=sys.stderr,
            disable=not progress,
        )
        with Recorder(model, clk) as rec, bar:
            for it in range(warmup + iters):
                for _, p in trainable:
                    p.grad = None
                record = rec.iteration(
                    lambda: _call_step(step_fn, model),
                    optimizer.step if optimizer is not None else None,
                )
                if it >= warmup:
                    records.append(record)
                bar.update(1)
        plain = [_plain_iteration(model, step_fn, trainable, optimizer) for _ in range(calibrate)]
        copy_us_per_byte = _copy_us_per_byte(trainable[0][1])
    finally:
        if threads is not None:
            torch.set_num_threads(old_threads)
        model.train(was_training)

    params = [
        ParamInfo(
            name=n,
            size_bytes=int(p.numel() * p.element_size()),
            element_bytes=int(p.element_size()),
            dtype=str(p.dtype).removeprefix("torch."),
        )
        for n, p in trainable
        if p.grad is not None
    ]
    if not params:
        raise InputError(
            "no parameter received a gradient: the loss does not depend on the model",
            where="profile",
            field="step_fn",
        )
    base_meta: dict[str, Any] = {
        "framework": "pytorch",
        "framework_version": torch.__version__,
        "device": device,
        "clock": clk.name,
        "threads": threads if threads is not None else old_threads,
        "iterations": iters,
        "warmup": warmup,
        "dtype": str(trainable[0][1].dtype).replace("torch.", ""),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "parameters": sum(int(p.numel()) for _, p in trainable),
        "parameters_without_grad": [n for n, p in trainable if p.grad is None],
    }
    # Other processes on the machine inflate CPU timings; the load says how much to trust them.
    base_meta["load_average_1min"] = [load_before, _load_average()]
    if plain:
        base_meta["uninstrumented_forward_us"] = float(np.median([f for f, _ in plain]))
        base_meta["uninstrumented_backward_us"] = float(np.median([b for _, b in plain]))
    base_meta.update(meta or {})
    trace = build_window(
        records,
        params=params,
        comm=comm,
        model_name=name or type(model).__name__,
        timing=timing,
        order_edges=order_edges,
        subtract_bookkeeping=clk.name == "host",
        meta=base_meta,
    )
    if trace.comm.copy_us_per_byte == 0 and copy_us_per_byte > 0:
        trace = dataclasses.replace(
            trace, comm=dataclasses.replace(trace.comm, copy_us_per_byte=copy_us_per_byte)
        )
    return _check_device_bound(trace, clk.name)


# The copy-back measurement's buffer: large enough that the call's fixed cost (tens of us) is
# lost in its per-byte rate, small beside any device's memory.
COPY_SAMPLE_BYTES = 16 << 20
COPY_SAMPLE_PIECES = 8


def _copy_us_per_byte(like: torch.Tensor, reps: int = 5) -> float:
    """What pace's runtime pays per byte to copy a fused unit's reduced buffer back into its
    gradients (``comm.copy_us_per_byte``): the runtime's call (``pace.runtime.unpack_pieces``,
    from one flat buffer into ``COPY_SAMPLE_PIECES`` tensors) on ``COPY_SAMPLE_BYTES`` of a
    gradient's device and dtype, median of ``reps`` after a warm-up. A rate of the memory, not
    of this model's gradients: a small model's would be the call's fixed cost spread over few
    bytes."""
    from pace.runtime import unpack_pieces

    numel = COPY_SAMPLE_BYTES // like.element_size()
    flat = torch.zeros(numel, dtype=like.dtype, device=like.device)
    copy_back, at = [], 0
    for piece in flat.chunk(COPY_SAMPLE_PIECES):
        copy_back.append((torch.empty_like(piece), at, at + piece.numel()))
        at += piece.numel()
    on_cuda = flat.is_cuda

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize(flat.device)

    times = []
    for _ in range(reps + 1):  # the first is a warm-up
        sync()
        t0 = time.perf_counter()
        unpack_pieces(flat, copy_back)
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:])) * 1e6 / (numel * like.element_size())


# Instrumented passes slower than this times the plain ones: the recorder, not the device, set
# the pace (see _check_device_bound).
HOST_BOUND_RATIO = 1.5


def _check_device_bound(trace: Trace, clock_name: str) -> Trace:
    """On a GPU, warn when the recorder's host work made the device wait.

    CUDA events time the stream, and the stream idles whenever the host has not launched the
    next kernel yet. The recorder costs tens of microseconds of Python per aten op, so with
    short kernels the device waits for it and every duration becomes host time (measured on an
    H100: ResNet-50 at batch 32, each op 2-4x its kernels' time; docs/gpu.md). The ratio of the
    instrumented to the plain passes says whether that happened; it is kept in
    ``meta["instrumented_over_plain"]``.
    """
    meta = trace.meta
    plain = (meta.get("uninstrumented_forward_us") or 0.0) + (
        meta.get("uninstrumented_backward_us") or 0.0
    )
    if clock_name != "cuda-events" or plain <= 0:
        return trace
    ratio = (float(meta["forward_wall_us"]) + float(meta["backward_wall_us"])) / plain
    if ratio > HOST_BOUND_RATIO:
        warnings.warn(
            f"pace profile: the instrumented passes took {ratio:.1f}x the plain ones on the "
            "GPU: the recorder's host work, not the device, set their pace, so op durations "
            "are host-bound (too long). Use a larger batch, or record with torch.profiler and "
            "`pace import --timing device` (docs/import.md) for kernel times",
            RuntimeWarning,
            stacklevel=3,
        )
    return dataclasses.replace(trace, meta={**meta, "instrumented_over_plain": round(ratio, 3)})


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not on every platform
        return None


def _plain_iteration(
    model: torch.nn.Module,
    step_fn: StepFn,
    trainable: list[tuple[str, torch.nn.Parameter]],
    optimizer: torch.optim.Optimizer | None,
) -> tuple[float, float]:
    """(forward_us, backward_us) of one iteration without any instrumentation (host clock)."""
    for _, p in trainable:
        p.grad = None
    device = _device_of(model)
    on_cuda = device.startswith("cuda")

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize(device)

    # The previous iteration's optimizer kernels may still be running: not this forward's time.
    sync()
    t0 = time.perf_counter()
    loss = _call_step(step_fn, model)
    sync()
    t1 = time.perf_counter()
    loss.backward()  # type: ignore[no-untyped-call]
    sync()
    t2 = time.perf_counter()
    if optimizer is not None:
        optimizer.step()
    return (t1 - t0) * 1e6, (t2 - t1) * 1e6


def _call_step(step_fn: StepFn, model: torch.nn.Module) -> torch.Tensor:
    try:
        loss = step_fn(model)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(
            f"the step function raised {type(exc).__name__}: {exc}",
            where="profile",
            field="step_fn",
        ) from exc
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise InputError(
            f"the step function must return the scalar loss tensor, got {_describe(loss)}",
            where="profile",
            field="step_fn",
        )
    if loss.grad_fn is None:
        raise InputError(
            "the loss returned by the step function does not require grad",
            where="profile",
            field="step_fn",
        )
    return loss


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    return type(x).__name__
