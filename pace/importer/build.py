"""One step of the execution trace -> the ``IterationRecord`` that ``pace profile`` records.

The importer does not build the trace window itself: it fills the profiler's own per-iteration
record (forward ops with their data dependencies, consumed parameters and folding; backward nodes
with their parents; the node after which each gradient is ready; start and end times) and hands
the records to ``pace.profiler.window.build_window``, so folding, medians, op names, order edges,
producers and consumers are exactly ``pace profile``'s.

Times are nanoseconds from the step's first forward op. ``timing`` is ``span`` or ``kernel``
(``pace profile --timing``: the wall time to the next op, or the op's own time) from the Kineto
CPU events, or ``device``: the GPU time of the kernels each op launched, given to
``build_window`` as ``kernel`` timing of ops that start at 0 and last that long.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from pace.importer.et import EtNode
from pace.importer.link import BackwardFlow, ForwardFlow, GradientLinks
from pace.importer.params import Markers, Naming
from pace.importer.steps import Step
from pace.importer.timing import Timed

if TYPE_CHECKING:
    from pace.profiler.record import IterationRecord

ImportTiming = Literal["span", "kernel", "device"]


def op_kind(node: EtNode) -> str:
    return node.name.removeprefix("aten::")


def module_of(params: tuple[str, ...]) -> str:
    """The module an op belongs to, as far as the trace tells: the one owning the parameters it
    reads (``fc.weight``, ``fc.bias`` -> ``fc``); ``""`` for an op that reads none (the
    execution trace records no module calls, so ``pace profile``'s ``layer1.0.relu`` is
    ``model.relu`` here)."""
    if not params:
        return ""
    paths = [p.split(".")[:-1] for p in params]
    common: list[str] = []
    for parts in zip(*paths, strict=False):
        if any(x != parts[0] for x in parts):
            break
        common.append(parts[0])
    return ".".join(common)


def step_record(
    step: Step,
    *,
    fw: ForwardFlow,
    bw: BackwardFlow,
    links: GradientLinks,
    naming: Naming,
    markers: Markers | None,
    timed: Timed,
    timing: ImportTiming,
    device_us: Mapping[int, float],
) -> IterationRecord:
    """The record of ``step``; ``device_us`` maps ET node ids of raw ops to their GPU time."""
    from pace.profiler.record import (
        ZERO_COST_BACKWARD,
        ZERO_COST_FORWARD,
        BwNode,
        FwOp,
        IterationRecord,
    )

    origin = step.forward_begin_us

    def ns(t_us: float) -> float:
        return (t_us - origin) * 1e3

    rec = IterationRecord(
        forward_end_ns=ns(step.forward_end_us),
        backward_start_ns=ns(step.forward_end_us),
        backward_end_ns=ns(step.backward_end_us),
        optimizer_ns=step.optimizer_us * 1e3,
    )
    buffers = markers.buffers if markers is not None else {}
    for i, op in enumerate(step.forward):
        kind = op_kind(op)
        params = tuple(
            dict.fromkeys(
                naming.names[t.storage_id] for t in op.inputs if t.storage_id in naming.names
            )
        )
        if markers is not None:
            # BatchNorm's num_batches_tracked += 1: buffers, and the 1 as a one-element leaf.
            only_buffers = any(t.storage_id in buffers for t in op.inputs) and all(
                (t.key in fw.leaves and t.storage_id in buffers) or t.numel <= 1 for t in op.inputs
            )
        else:  # the same, told by its form: an in-place write of a leaf, reading only leaves
            only_buffers = fw.inplace_on_leaves[i]
        in_keys = {t.key for t in op.inputs}
        # A call that returns its input unchanged (``to`` the same dtype) or no tensor at all
        # (``cudnn_is_acceptable``) ran nothing below autograd, so pace profile never sees it.
        returns_input = not kind.endswith("_") and all(t.key in in_keys for t in op.outputs)
        rec.fw.append(
            FwOp(
                kind=kind,
                module=module_of(params),
                deps=fw.deps[i],
                params=params,
                fold=kind in ZERO_COST_FORWARD or returns_input or (only_buffers and not params),
            )
        )
        if op.seq >= 0:
            # Every op records the next sequence number; the last op with it is the one whose
            # autograd node took it (pace profile reads the node's own number).
            rec.fw_seq[op.seq] = i
    for k, node in enumerate(step.backward):
        rec.bw.append(
            BwNode(
                kind=node.name,
                seq_nr=node.seq,
                parents=bw.parents[k],
                fold=node.name in ZERO_COST_BACKWARD,
            )
        )
    for storage, ready, producers in zip(links.storage, bw.ready, bw.grad_producers, strict=True):
        if storage is None or storage not in naming.names:
            continue
        name = naming.names[storage]
        if ready is not None:
            rec.grad_ready[name] = ready
        rec.grad_parents[name] = tuple(sorted(producers))
    if timing == "device":
        rec.fw_start_ns = [0.0] * len(step.forward)
        rec.fw_end_ns = [device_us.get(op.id, 0.0) * 1e3 for op in step.forward]
        rec.bw_start_ns = [0.0] * len(step.backward)
        rec.bw_end_ns = [device_us.get(n.id, 0.0) * 1e3 for n in step.backward]
    else:
        rec.fw_start_ns = [ns(t) for t in step.forward_start_us]
        rec.fw_end_ns = [
            ns(t + own) for t, own in zip(step.forward_start_us, step.forward_own_us, strict=True)
        ]
        rec.bw_start_ns = [ns(timed.start_us[n.id]) for n in step.backward]
        rec.bw_end_ns = [ns(timed.end_us[n.id]) for n in step.backward]
    return rec
