"""Turn recorded iterations into the trace window: backward of iteration k + forward of k+1.

Folding: zero-cost and buffer-only ops are not ops of the trace. They stay transparent for data
dependencies (an op that reads a view of another op's output depends on that op), and their time
is kept: in ``span`` timing each kept op owns the wall time until the next kept op starts (minus
the recorder's own bookkeeping), so the ops' durations add up to the measured pass time; in
``kernel`` timing a kept op owns its own kernel time plus the kernels of the folded ops after it.

Order edges: a CPU (or one CUDA stream) runs the ops one at a time, in the observed order. That
limit is part of the hardware, so every op also depends on the op that ran just before it
(``order_edges=False`` leaves only the data dependencies, a what-if for a device with more
parallelism). Producers are backward ops and consumers forward ops of the next iteration, and
every backward op precedes every forward op, so the Lemma-1 rule holds by construction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pace.errors import InputError
from pace.ir import CommModel, Op, Tensor, Trace
from pace.profiler.record import IterationRecord

Timing = Literal["span", "kernel"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamInfo:
    """A parameter that received a gradient: its name, gradient size, element size and dtype
    (torch's name, ``""``: unknown)."""

    name: str
    size_bytes: int
    element_bytes: int = 1
    dtype: str = ""


def _resolve(raw_deps: Sequence[tuple[int, ...]], kept: Sequence[bool]) -> list[tuple[int, ...]]:
    """Dependencies of every raw op expressed in kept raw ops (folded ops are transparent)."""
    memo: list[tuple[int, ...]] = []
    for deps in raw_deps:  # raw deps always point backwards, so one forward pass suffices
        out: set[int] = set()
        for d in deps:
            if kept[d]:
                out.add(d)
            else:
                out.update(memo[d])
        memo.append(tuple(sorted(out)))
    return memo


def _durations(
    *,
    kept: Sequence[int],
    start: Sequence[float],
    end: Sequence[float],
    book: Sequence[float],
    begin_ns: float,
    end_ns: float,
    timing: Timing,
) -> list[float]:
    """Duration (ns) of each kept op of one pass of one iteration."""
    n = len(start)
    cum_book = np.concatenate([[0.0], np.cumsum(np.asarray(book, dtype=float))])
    out: list[float] = []
    for pos, i in enumerate(kept):
        lo = 0 if pos == 0 else i  # ops folded before the first kept op belong to it
        hi = kept[pos + 1] if pos + 1 < len(kept) else n
        if timing == "span":
            t0 = begin_ns if pos == 0 else start[i]
            t1 = start[hi] if hi < n else end_ns
            d = t1 - t0 - float(cum_book[hi] - cum_book[lo])
        else:
            d = float(sum(end[r] - start[r] for r in range(lo, hi)))
        out.append(max(d, 0.0))
    return out


def select_steady(records: Sequence[IterationRecord]) -> list[IterationRecord]:
    """The iterations whose op structure equals the last one's (data-dependent models vary)."""
    if not records:
        raise InputError("no iterations were recorded", where="profile", field="iters")
    ref = records[-1].signature()
    same = [r for r in records if r.signature() == ref]
    if 2 * len(same) < len(records):
        raise InputError(
            f"the op sequence differs between iterations ({len(same)} of {len(records)} match "
            "the last); data-dependent control flow cannot be profiled as one static DAG",
            where="profile",
            field="step_fn",
        )
    return same


def build_window(
    records: Sequence[IterationRecord],
    *,
    params: Sequence[ParamInfo],
    comm: CommModel,
    model_name: str,
    timing: Timing = "span",
    order_edges: bool = True,
    subtract_bookkeeping: bool = True,
    meta: Mapping[str, Any] | None = None,
) -> Trace:
    """The trace window of docs/trace-format.md from recorded steady-state iterations (medians)."""
    recs = select_steady(records)
    ref = recs[-1]

    fw_kept_flags = [not op.fold for op in ref.fw]
    bw_kept_flags = [not n.fold for n in ref.bw]
    if not any(bw_kept_flags):  # degenerate graph of views only: keep everything
        bw_kept_flags = [True] * len(ref.bw)
    if not any(fw_kept_flags):
        fw_kept_flags = [True] * len(ref.fw)
    fw_kept = [i for i, k in enumerate(fw_kept_flags) if k]
    bw_kept = [i for i, k in enumerate(bw_kept_flags) if k]
    if not fw_kept or not bw_kept:
        raise InputError("the step recorded no forward or no backward computation", where="profile")

    fw_ns = []
    bw_ns = []
    for r in recs:
        book = [op.book_after_ns if subtract_bookkeeping else 0.0 for op in r.fw]
        fw_ns.append(
            _durations(
                kept=fw_kept,
                start=r.fw_start_ns,
                end=r.fw_end_ns,
                book=book,
                begin_ns=0.0,
                end_ns=r.forward_end_ns,
                timing=timing,
            )
        )
        bw_ns.append(
            _durations(
                kept=bw_kept,
                start=r.bw_start_ns,
                end=r.bw_end_ns,
                book=[0.0] * len(r.bw),
                begin_ns=r.backward_start_ns,
                end_ns=r.backward_end_ns,
                timing=timing,
            )
        )
    fw_us = np.median(np.asarray(fw_ns), axis=0) / 1e3
    bw_us = np.median(np.asarray(bw_ns), axis=0) / 1e3

    def fw_label(i: int) -> str:
        op = ref.fw[i]
        return f"{op.module or 'model'}.{op.kind}"

    def bw_label(i: int) -> str:
        node = ref.bw[i]
        link = ref.fw_seq.get(node.seq_nr)
        module = ref.fw[link].module if link is not None else ""
        return f"{module or 'model'}.{node.kind}"

    bw_name = {i: f"bw.{k:04d}.{bw_label(i)}" for k, i in enumerate(bw_kept)}
    fw_name = {i: f"fw.{k:04d}.{fw_label(i)}" for k, i in enumerate(fw_kept)}

    bw_deps = _resolve([n.parents for n in ref.bw], bw_kept_flags)
    fw_deps = _resolve([op.deps for op in ref.fw], fw_kept_flags)

    ops: list[Op] = []
    prev: str | None = None
    for k, i in enumerate(bw_kept):
        deps = [bw_name[d] for d in bw_deps[i]]
        if order_edges and prev is not None and prev not in deps:
            deps.append(prev)
        ops.append(
            Op(name=bw_name[i], phase="backward", duration_us=float(bw_us[k]), deps=tuple(deps))
        )
        prev = bw_name[i]
    last_bw = prev
    for k, i in enumerate(fw_kept):
        deps = [fw_name[d] for d in fw_deps[i]]
        if order_edges and prev is not None and prev not in deps:
            deps.append(prev)
        ops.append(
            Op(name=fw_name[i], phase="forward", duration_us=float(fw_us[k]), deps=tuple(deps))
        )
        prev = fw_name[i]

    # A folded backward node's time belongs to the kept op that ran before it (its span covers
    # it), so a gradient made ready by a folded node (TBackward0 of a Linear weight) is produced
    # by that op.
    owner: list[int] = []
    last_kept = bw_kept[0]
    for i, flag in enumerate(bw_kept_flags):
        if flag:
            last_kept = i
        owner.append(last_kept)

    consumers: dict[str, list[str]] = {}
    for i in fw_kept:
        for p in ref.fw[i].params:
            consumers.setdefault(p, []).append(fw_name[i])

    tensors: list[tuple[int, Tensor]] = []
    for param in params:
        ready = ref.grad_ready.get(param.name)
        if ready is None:
            feeding = ref.grad_parents.get(param.name, ())
            # Several producers (tied weights, reuse): ready after the last of them.
            ready = max(feeding) if feeding else None
        if ready is None:
            raise InputError(
                f"parameter {param.name!r} has a gradient but no backward op produced it",
                where="profile",
            )
        producer_raw = owner[ready]
        tensors.append(
            (
                producer_raw,
                Tensor(
                    name=param.name,
                    size_bytes=param.size_bytes,
                    producer=bw_name[producer_raw],
                    consumers=tuple(consumers.get(param.name, ())),
                    element_bytes=param.element_bytes,
                    dtype=param.dtype,
                ),
            )
        )
    # Ready-time order (stable: ties keep the model's parameter order).
    tensors.sort(key=lambda pt: pt[0])

    fw_wall = [r.forward_end_ns / 1e3 for r in recs]
    bw_wall = [(r.backward_end_ns - r.backward_start_ns) / 1e3 for r in recs]
    opt_wall = [r.optimizer_ns / 1e3 for r in recs]
    info: dict[str, Any] = {
        "timing": timing,
        "order_edges": order_edges,
        "iterations_used": len(recs),
        "forward_wall_us": float(np.median(fw_wall)),
        "backward_wall_us": float(np.median(bw_wall)),
        "optimizer_us": float(np.median(opt_wall)),
        "raw_forward_ops": len(ref.fw),
        "raw_backward_nodes": len(ref.bw),
        "forward_ops": len(fw_kept),
        "backward_ops": len(bw_kept),
        "last_backward_op": last_bw,
    }
    info.update(meta or {})
    total_bytes = sum(t.size_bytes for _, t in tensors)
    if comm.update_us_per_byte == 0 and info["optimizer_us"] > 0 and total_bytes > 0:
        # pace's overlapped runtime runs this step piecewise, each parameter once reduced,
        # before the forward may use it: the step's cost per byte of gradient.
        comm = dataclasses.replace(
            comm, update_us_per_byte=float(info["optimizer_us"]) / total_bytes
        )
    return Trace(
        model=model_name,
        ops=tuple(ops),
        tensors=tuple(t for _, t in tensors),
        comm=comm,
        meta=info,
    )
