"""``import_trace(kineto, execution_trace=...) -> ImportResult``: the importer's entry function."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pace.errors import InputError
from pace.importer.build import ImportTiming, step_record
from pace.importer.comm import CommSamples, measured_allreduces
from pace.importer.et import ExecutionTrace, TensorRef, load_execution_trace, torch_dtype_name
from pace.importer.files import PathLike
from pace.importer.kineto import KinetoTrace, load_kineto
from pace.importer.link import (
    BackwardFlow,
    ForwardFlow,
    GradientLinks,
    backward_flow,
    forward_flow,
    link_gradients,
    optimizer_order,
)
from pace.importer.params import (
    Markers,
    Naming,
    find_markers,
    load_parameters,
    name_anonymously,
    name_from_file,
    name_from_markers,
)
from pace.importer.steps import ENGINE_PREFIX, CallTree, Step, et_steps, phases
from pace.importer.timing import Timed, kineto_steps, match_timings
from pace.ir import CommModel, Trace

if TYPE_CHECKING:
    from pace.profiler.record import IterationRecord

TIMINGS: tuple[str, ...] = ("span", "kernel", "device")


@dataclass(frozen=True, kw_only=True, slots=True)
class ImportResult:
    """The imported trace, what was measured about communication, and what was approximated."""

    trace: Trace
    comm: CommSamples
    warnings: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Run:
    """One step's structure with one Kineto step's times, and its data flow."""

    step: Step
    timed: Timed
    fw: ForwardFlow
    bw: BackwardFlow
    links: GradientLinks


def import_trace(
    kineto: PathLike,
    *,
    execution_trace: PathLike | None,
    parameters: PathLike | None = None,
    comm: CommModel | None = None,
    timing: ImportTiming | None = None,
    order_edges: bool = True,
    name: str | None = None,
) -> ImportResult:
    """Build the trace window of docs/trace-format.md from a torch.profiler trace and an
    execution trace of the same program (docs/import.md).

    ``parameters``: a file written by ``save_parameters`` (names when the trace has no markers).
    ``comm``: the cost model to embed; default: the one fitted to the all-reduces measured in the
    Kineto trace, else ``pace profile``'s what-if ring (8 workers, 10 Gbps). ``timing``: ``span``
    or ``kernel`` CPU time (``pace profile --timing``) or ``device`` GPU kernel time; default
    ``device`` when the Kineto trace has GPU kernels, else ``span``.

    Raises ``InputError`` naming the file and the field for unreadable, malformed, truncated or
    mismatched files (an execution trace of another program is refused).
    """
    if timing is not None and timing not in TIMINGS:
        raise InputError(f"must be one of {', '.join(TIMINGS)}, got {timing!r}", where="--timing")
    kin = load_kineto(kineto)
    if execution_trace is None:
        raise InputError(
            f"missing: {Path(kineto).name} alone has no op graph and no tensor identities, so no "
            "gradients; record the execution trace with it (pace.importer.record or "
            "ExecutionTraceObserver, docs/import.md)",
            where="--execution-trace",
        )
    et = load_execution_trace(execution_trace)
    has_kernels = any(not _is_comm_kernel(e.name) for e in kin.device_events)
    chosen: ImportTiming = timing or ("device" if has_kernels else "span")
    if chosen == "device" and not has_kernels:
        raise InputError(
            f"{Path(kineto).name} has no GPU kernels: use span or kernel timing", where="--timing"
        )
    markers = find_markers(et)
    runs = _timed_steps(et, kin, markers)
    last = runs[-1]
    found = {s: last.links.tensor[s] for s in last.links.storage if s is not None}
    if not found:
        raise InputError(
            "no gradient could be linked to a parameter (no AccumulateGrad node whose gradient "
            "has the shape of a forward input)",
            where=et.path,
            field="nodes",
        )
    naming = _naming(markers, parameters, found, last)
    launcher = kin.launching_host_event() if chosen == "device" else {}
    records = [
        step_record(
            r.step,
            fw=r.fw,
            bw=r.bw,
            links=r.links,
            naming=naming,
            markers=markers,
            timed=r.timed,
            timing=chosen,
            device_us=_device_times(et, kin, r, launcher) if chosen == "device" else {},
        )
        for r in runs
    ]
    measured = measured_allreduces(kin)
    model, comm_source = _cost_model(comm, measured)
    warnings = list(naming.warnings)
    if last.links.unlinked:
        warnings.append(f"{last.links.unlinked} gradient(s) linked to a parameter by shape alone")
    observed = all(r.timed.observed for r in runs)
    if observed:
        warnings.append(
            "timed by the step the execution-trace observer recorded: its overhead is in the "
            "durations (record more steps, docs/import.md)"
        )
    meta: dict[str, Any] = {
        "source": "torch.profiler + execution trace (pace import)",
        "framework": "pytorch",
        "timing": chosen,
        "kineto_file": Path(kineto).name,
        "execution_trace_file": Path(execution_trace).name,
        "execution_trace_schema": et.schema,
        "device": "cuda" if has_kernels else "cpu",
        "steps": [r.step.label for r in runs],
        "parameter_names": naming.source,
        "parameters_without_grad": list(naming.without_grad),
        "comm_source": comm_source,
        "import": {
            "warnings": warnings,
            "observer_in_timings": observed,
            "gradients_with_same_shape_candidates": last.links.ambiguous,
            "ops_after_backward": last.step.after_backward_ops,
            **_comm_meta(measured),
        },
    }
    trace = _window(
        records,
        naming=naming,
        found=found,
        comm=model,
        timing=chosen,
        order_edges=order_edges,
        name=name,
        meta=meta,
        where=et.path,
    )
    return ImportResult(trace=trace, comm=measured, warnings=tuple(warnings))


def _cost_model(comm: CommModel | None, measured: CommSamples) -> tuple[CommModel, str]:
    """The given model, else the measured fit, else ``pace profile``'s default what-if."""
    if comm is not None:
        return comm, "given"
    if measured.model is not None:
        return measured.model, "measured"
    from pace.profiler.comm import what_if_comm

    return (
        what_if_comm(workers=8, bandwidth_gbps=10.0),
        "what-if ring: 8 workers, 10 Gbps (no all-reduce measured to fit)",
    )


def _comm_meta(measured: CommSamples) -> dict[str, Any]:
    out: dict[str, Any] = {
        "allreduce_calls": measured.calls,
        "allreduce_source": measured.source,
        "allreduce_samples": [list(s) for s in measured.samples],
        "allreduce_note": measured.note,
    }
    if measured.quality is not None:
        out["allreduce_fit_r2"] = measured.quality.r2
        out["allreduce_fit_max_rel_error"] = measured.quality.max_rel_error
    return out


def _is_comm_kernel(name: str) -> bool:
    return name.startswith("nccl")


def _timed_steps(et: ExecutionTrace, kin: KinetoTrace, markers: Markers | None) -> list[_Run]:
    """Every execution-trace step with a backward pass, once per Kineto step that times it."""
    tree = CallTree(et)
    ksteps = kineto_steps(kin)
    parent_of = {n.id: n.parent for n in et.nodes}
    runs: list[_Run] = []
    first_error: InputError | None = None
    for label, members in et_steps(et):
        try:
            timings = match_timings(members, kin, ksteps, where=et.path)
        except InputError as exc:
            first_error = first_error or exc
            continue
        for timed in timings:
            step = phases(f"{label} timed by {timed.kineto_step}", members, tree, timed)
            if step is None:
                continue
            fw = forward_flow(step)
            bw = backward_flow(step, timed, parent_of)
            if markers is not None:
                marked = frozenset(t.storage_id for _, t in markers.parameters)
                order = {t.storage_id: k for k, (_, t) in enumerate(markers.parameters)}
                links = link_gradients(step, fw, bw, is_parameter=_among(marked), order=order)
            else:  # any leaf of the forward pass may be a parameter
                links = link_gradients(step, fw, bw, is_parameter=_any, order=fw.first_use)
            runs.append(_Run(step=step, timed=timed, fw=fw, bw=bw, links=links))
    if not runs:
        if first_error is not None:
            raise first_error
        raise InputError(
            "no step with a backward pass (no autograd node ran while recording): profile a "
            "training step, loss.backward() included",
            where=et.path,
            field="nodes",
        )
    return runs


def _among(storages: frozenset[int]) -> Callable[[TensorRef], bool]:
    def is_marked(t: TensorRef) -> bool:
        return t.storage_id in storages

    return is_marked


def _any(_: TensorRef) -> bool:
    return True


def _naming(
    markers: Markers | None,
    parameters: PathLike | None,
    found: Mapping[int, TensorRef],
    run: _Run,
) -> Naming:
    if markers is not None:
        return name_from_markers(markers, found)
    by_optimizer = optimizer_order(run.step.optimizer, set(found))
    if len(by_optimizer) == len(found):
        order, source = sorted(found, key=by_optimizer.__getitem__), "optimizer-step"
    else:
        first = run.fw.first_use
        order = sorted(found, key=lambda s: (first.get(s, len(first)), s))
        source = "first-forward-use"
    if parameters is None:
        return name_anonymously(order, source)
    specs = load_parameters(parameters)
    return name_from_file(specs, found, order, where=str(parameters), order_source=source)


def _device_times(
    et: ExecutionTrace, kin: KinetoTrace, run: _Run, launcher: Mapping[int, Any]
) -> dict[int, float]:
    """GPU time (us) of the kernels each raw op of ``run`` launched, by node id.

    Kernels launched by the engine around an autograd node (shape checks, gradient sums) count
    for that node, those of ``AccumulateGrad`` for the node the gradient is ready after (as its
    time does in ``span`` timing); NCCL kernels are communication, not compute.
    """
    step = run.step
    by_id = et.by_id()
    owner: dict[int, int] = {n.id: n.id for n in (*step.forward, *step.backward)}
    for n in step.engine:
        if n.name.startswith(ENGINE_PREFIX):
            inner = n.name[len(ENGINE_PREFIX) :]
            for kid in et.children.get(n.id, ()):
                if kid in owner and by_id[kid].name == inner:
                    owner[n.id] = kid
    for acc, ready in zip(step.accumulate, run.bw.ready, strict=True):
        if ready is not None:
            owner[acc.id] = step.backward[ready].id
    parent_of = {n.id: n.parent for n in et.nodes}
    out: dict[int, float] = {}
    for i, host in launcher.items():
        event = kin.events[i]
        if _is_comm_kernel(event.name):
            continue
        ext = host.arg_int("External id")
        cur = run.timed.node_of_event.get(ext) if ext is not None else None
        seen: set[int] = set()  # a damaged file's ctrl_deps may loop
        while cur is not None and cur not in owner and cur not in seen:
            seen.add(cur)
            nxt = parent_of.get(cur)
            cur = None if nxt is None or nxt == cur else nxt
        if cur is not None and cur in owner:
            out[owner[cur]] = out.get(owner[cur], 0.0) + event.dur_us
    return out


def _window(
    records: Sequence[IterationRecord],
    *,
    naming: Naming,
    found: Mapping[int, TensorRef],
    comm: CommModel,
    timing: ImportTiming,
    order_edges: bool,
    name: str | None,
    meta: Mapping[str, Any],
    where: str,
) -> Trace:
    from pace.profiler.window import ParamInfo, build_window
    from pace.verify import verify_trace

    params = [
        ParamInfo(
            name=naming.names[s],
            size_bytes=found[s].size_bytes,
            element_bytes=found[s].itemsize,
            dtype=torch_dtype_name(found[s].dtype),
        )
        for s in naming.order
    ]
    try:
        trace = build_window(
            records,
            params=params,
            comm=comm,
            model_name=name or "imported",
            timing="span" if timing == "span" else "kernel",
            order_edges=order_edges,
            subtract_bookkeeping=False,
            meta=meta,
        )
    except InputError as exc:
        # The profiler words its errors for a live model; here the file is at fault.
        raise InputError(exc.detail, where=where, field="nodes") from None
    verify_trace(trace, where=where)
    return trace
