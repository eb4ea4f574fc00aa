"""Measured all-reduces in a Kineto trace -> ``(bytes, us)`` samples -> a fitted cost model.

What counts as one all-reduce:

* **NCCL** (GPU): a device event whose name starts with ``ncclKernel_AllReduce`` (NCCL <= 2.18,
  ``ncclKernel_AllReduce_RING_LL_Sum_float``) or ``ncclDevKernel_AllReduce`` (NCCL >= 2.19,
  ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``). Its time is the kernel's duration. The message
  size is ``args["In msg nelems"]`` times the element size of ``args["dtype"]``, read from the
  kernel or, when the profiler left them on the launching op (``record_param_comms``), from that
  op; the element type in the kernel's name is the last resort.
* **gloo** (CPU): a ``gloo:all_reduce`` event, which gloo's worker thread records around the
  collective itself; the size is its ``Input Dims`` times the element size of ``Input type``.

The group size is ``args["Group size"]`` or the trace's ``distributedInfo.world_size``. Samples
of one size are reduced to their median (the first call of a size pays connection set-up), and
``pace.cost.fit_linear`` fits ``alpha_us + beta_us_per_byte * bytes`` when there are two sizes or
more; with one size there is nothing to fit, and the samples are only reported.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pace.cost import FitQuality, fit_linear
from pace.importer.kineto import DEVICE_CATEGORIES, KinetoEvent, KinetoTrace
from pace.ir import CommModel

NCCL_ALLREDUCE_RE = re.compile(r"^nccl(Dev)?Kernel_AllReduce")
GLOO_ALLREDUCE = "gloo:all_reduce"

# Element sizes by the spellings the profiler uses: c10 ScalarType names (NCCL kernel args),
# C++ type names (cpu_op "Input type"), and the type tokens in NCCL kernel names.
ELEMENT_BYTES: Mapping[str, int] = {
    "float": 4, "Float": 4, "f32": 4,
    "double": 8, "Double": 8, "f64": 8,
    "c10::Half": 2, "Half": 2, "half": 2, "f16": 2,
    "c10::BFloat16": 2, "BFloat16": 2, "bf16": 2, "__nv_bfloat16": 2,
    "long int": 8, "Long": 8, "int64_t": 8, "i64": 8,
    "int": 4, "Int": 4, "int32_t": 4, "i32": 4,
    "short int": 2, "Short": 2,
    "signed char": 1, "Char": 1, "int8_t": 1, "i8": 1,
    "unsigned char": 1, "Byte": 1, "uint8_t": 1, "u8": 1,
    "bool": 1, "Bool": 1,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class CommSamples:
    """The all-reduces found, and the model fitted to them when that is possible."""

    source: str  # "nccl", "gloo" or "" (none found)
    samples: tuple[tuple[int, float], ...]  # (bytes, us), one median per size
    calls: int  # all-reduce events read
    workers: int | None
    model: CommModel | None
    quality: FitQuality | None
    note: str  # why there is no model, or ""


def measured_allreduces(kineto: KinetoTrace) -> CommSamples:
    """The all-reduce samples of ``kineto`` (module docstring)."""
    launcher = kineto.launching_host_event()
    raw: list[tuple[int, float]] = []
    sizes: list[int | None] = []
    groups: set[int] = set()
    source = ""
    for i, e in enumerate(kineto.events):
        if e.cat in DEVICE_CATEGORIES and NCCL_ALLREDUCE_RE.match(e.name):
            source = "nccl"
            host = launcher.get(i)
            nbytes = _nccl_bytes(e, host)
            group = e.arg_int("Group size") or (host.arg_int("Group size") if host else None)
        elif e.name == GLOO_ALLREDUCE:
            source = source or "gloo"
            nbytes = _input_bytes(e.args)
            group = e.arg_int("Group size")
        else:
            continue
        sizes.append(nbytes)
        if group:
            groups.add(group)
        if nbytes is not None and nbytes > 0:
            raw.append((nbytes, e.dur_us))
    world = kineto.distributed.get("world_size")
    if not groups and isinstance(world, int) and not isinstance(world, bool) and world > 0:
        groups.add(world)
    workers = max(groups) if groups else None
    by_size: dict[int, list[float]] = {}
    for b, us in raw:
        by_size.setdefault(b, []).append(us)
    samples = tuple(sorted((b, float(statistics.median(v))) for b, v in by_size.items()))
    unsized = sum(1 for s in sizes if s is None or s <= 0)
    model: CommModel | None = None
    quality: FitQuality | None = None
    note = ""
    if not sizes:
        note = "no all-reduce in the Kineto trace"
    elif workers is None or workers < 2:
        note = "the group size of the all-reduces is unknown (no 'Group size', no world_size)"
    elif len(samples) < 2:
        note = f"all-reduces of {len(samples)} size(s) only: nothing to fit"
    else:
        model, quality = fit_linear(samples, workers=workers)
    if unsized and not note:
        note = f"{unsized} all-reduce(s) of unknown size ignored"
    return CommSamples(
        source=source,
        samples=samples,
        calls=len(sizes),
        workers=workers,
        model=model,
        quality=quality,
        note=note,
    )


def _nccl_bytes(kernel: KinetoEvent, host: KinetoEvent | None) -> int | None:
    for event in (kernel, host):
        if event is None:
            continue
        nelems = event.arg_int("In msg nelems")
        dtype = event.args.get("dtype")
        size = ELEMENT_BYTES.get(dtype) if isinstance(dtype, str) else None
        if nelems is not None and size is None:
            size = _dtype_from_name(kernel.name)
        if nelems is not None and size is not None:
            return nelems * size
    return _input_bytes(host.args) if host is not None else None


def _dtype_from_name(name: str) -> int | None:
    # ncclDevKernel_AllReduce_Sum_f32_RING_LL(...), ncclKernel_AllReduce_RING_LL_Sum_float(...)
    for token in re.split(r"[_(),\s*]+", name):
        if token in ELEMENT_BYTES:
            return ELEMENT_BYTES[token]
    return None


def _input_bytes(args: Mapping[str, Any]) -> int | None:
    """Bytes of the tensors of a host event with ``record_shapes``: Input Dims x Input type."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or not dims:
        return None
    total = 0
    for d, t in zip(dims, types, strict=False):
        shapes: Sequence[Any] = d if d and all(isinstance(x, list) for x in d) else [d]
        size = ELEMENT_BYTES.get(t) if isinstance(t, str) else None
        if size is None:
            continue
        for shape in shapes:
            if isinstance(shape, list) and all(isinstance(x, int) for x in shape):
                n = 1
                for x in shape:
                    n *= x
                total += n * size
    return total or None
