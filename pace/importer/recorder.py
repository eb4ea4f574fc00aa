"""Record the two files ``pace import`` reads, for a model and its step function.

``record(model, step_fn, kineto=..., execution_trace=...)`` runs ``warmup`` steps, then records
``1 + iters`` steps with ``torch.profiler.profile`` (``record_shapes=True``, a ``schedule`` of
``warmup`` steps then ``1 + iters`` active ones, ``prof.step()`` after each step,
``export_chrome_trace`` at the end) and an ``ExecutionTraceObserver`` started and stopped by hand
around the first recorded step only. That step gives the structure; the ``iters`` steps after it
give the timings, free of the observer's cost (it formats every argument of every call while the
step runs: tens of microseconds per op, inside the Kineto spans). The step is the one ``pace
profile`` runs: gradients set to ``None``, ``loss = step_fn(model)``, ``loss.backward()``,
``optimizer.step()``.

Inside each step, before the step function, a ``pace::parameters`` scope marks every trainable
parameter and buffer by name (one ``aten::alias`` each, under ``no_grad``; tens of microseconds
in all, outside the forward and backward pass), so the import knows every name exactly
(``pace.importer.params``). ``save_parameters`` writes the ``named_parameters()`` file for traces
recorded without the markers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pace.errors import InputError
from pace.importer.files import PathLike
from pace.importer.params import (
    BUFFER_PREFIX,
    MARKER_SCOPE,
    PARAMETER_PREFIX,
    ParamSpec,
    parameters_document,
)
from pace.io import write_atomic

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True, slots=True)
class Recorded:
    """The files written."""

    kineto: Path
    execution_trace: Path
    parameters: Path | None


def parameter_specs(model: torch.nn.Module) -> list[ParamSpec]:
    return [
        ParamSpec(
            name=n,
            shape=tuple(int(d) for d in p.shape),
            element_bytes=int(p.element_size()),
            requires_grad=bool(p.requires_grad),
        )
        for n, p in model.named_parameters()
    ]


def save_parameters(model: torch.nn.Module, path: PathLike) -> None:
    """Write the ``named_parameters()`` of ``model`` (names, shapes, element sizes, in order)
    for ``pace import --parameters``; a few hundred bytes per parameter, no profiling."""
    doc = parameters_document(
        parameter_specs(model),
        buffers=[n for n, _ in model.named_buffers()],
        model=type(model).__name__,
    )
    try:
        write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode("utf-8"))
    except OSError as exc:
        raise InputError(f"cannot write file: {exc.strerror or exc}", where=str(path)) from None


def mark_parameters(model: torch.nn.Module) -> None:
    """Record, in the running profiler, which tensor is which parameter and buffer."""
    import torch
    from torch.autograd.profiler import record_function

    with torch.no_grad(), record_function(MARKER_SCOPE):
        for name, p in model.named_parameters():
            if p.requires_grad:
                with record_function(PARAMETER_PREFIX + name):
                    torch.ops.aten.alias(p)
        for name, b in model.named_buffers():
            with record_function(BUFFER_PREFIX + name):
                torch.ops.aten.alias(b)


def record(
    model: torch.nn.Module,
    step_fn: Callable[[torch.nn.Module], torch.Tensor],
    *,
    kineto: PathLike,
    execution_trace: PathLike,
    parameters: PathLike | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    iters: int = 2,
    warmup: int = 1,
    threads: int | None = 1,
    mark: bool = True,
) -> Recorded:
    """Run ``warmup + 1 + iters`` training steps and record the last ``1 + iters`` (module
    docstring): the execution trace of the first of them, the Kineto trace of all.

    ``mark=False`` records exactly what plain ``torch.profiler`` and ``ExecutionTraceObserver``
    runs would (no markers: names then come from ``parameters``). GPU activity is recorded when
    CUDA is available.
    """
    import torch
    from torch.profiler import (
        ExecutionTraceObserver,
        ProfilerActivity,
        profile,
        schedule,
    )

    if iters < 0:
        raise InputError(f"must be >= 0, got {iters}", where="record", field="iters")
    if warmup < 0:
        raise InputError(f"must be >= 0, got {warmup}", where="record", field="warmup")
    kineto_path, et_path = Path(kineto), Path(execution_trace)
    if parameters is not None:
        save_parameters(model, parameters)
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    trainable = [p for p in model.parameters() if p.requires_grad]
    observer = ExecutionTraceObserver().register_callback(str(et_path))
    try:
        with profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=warmup, active=1 + iters, repeat=1),
            record_shapes=True,
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(kineto_path)),
        ) as prof:
            for i in range(warmup + 1 + iters):
                if i == warmup:
                    observer.start()
                if mark:
                    mark_parameters(model)
                for p in trainable:
                    p.grad = None
                loss = step_fn(model)
                loss.backward()  # type: ignore[no-untyped-call]
                if optimizer is not None:
                    optimizer.step()
                if i == warmup:
                    observer.stop()
                prof.step()
    finally:
        observer.unregister_callback()
        if threads is not None:
            torch.set_num_threads(old_threads)
    return Recorded(
        kineto=kineto_path,
        execution_trace=et_path,
        parameters=Path(parameters) if parameters is not None else None,
    )
