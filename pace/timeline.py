"""Timelines of simulated iterations: a Gantt chart (PNG) and a Chrome/Perfetto trace (JSON).

Entry: :func:`build_timeline` (``trace, runs -> Timeline``), where ``runs`` maps a label to a
:class:`pace.sim.SimResult` replayed on ``trace``. :func:`to_chrome` turns the timeline into a
Trace Event Format object (load it in https://ui.perfetto.dev or ``chrome://tracing``) and
:func:`render_png` draws it with matplotlib (the ``plot`` extra; :func:`figure` returns the
Figure), one panel per run on a shared time axis.

The replay semantics run ops in parallel without limit and, with ``credit > 1``, several units
at once, so each run's bars are packed into as many lanes as overlap needs (greedy interval
partitioning: the fewest lanes possible, and no two bars of a lane overlap, which the Chrome
format needs for its ``X`` events to nest).

Communication units are coloured by the depth of the layer they feed: the rank of the tensor's
first consumer in the next forward pass (0 = the input side, needed first). FIFO sends the output
side first; pace's schedule moves the input side forward, and the colours show it.

>>> from pace.ir import CommModel, Op, Tensor, Trace
>>> from pace.sim import simulate
>>> trace = Trace(
...     model="tiny",
...     ops=(
...         Op(name="bw2", phase="backward", duration_us=10),
...         Op(name="bw1", phase="backward", duration_us=10, deps=("bw2",)),
...         Op(name="fw1", phase="forward", duration_us=5, deps=("bw1",)),
...         Op(name="fw2", phase="forward", duration_us=5, deps=("fw1",)),
...     ),
...     tensors=(
...         Tensor(name="w2", size_bytes=20, producer="bw2", consumers=("fw2",)),
...         Tensor(name="w1", size_bytes=4, producer="bw1", consumers=("fw1",)),
...     ),
...     comm=CommModel(workers=2, alpha_us=0.0, beta_us_per_byte=1.0),
... )
>>> tl = build_timeline(trace, {"FIFO": simulate(trace, "fifo")})
>>> run = tl.runs[0]
>>> run.iteration_us, run.compute_lanes, run.comm_lanes
(44.0, 1, 1)
>>> [(b.name, b.start_us, b.finish_us) for b in run.bars if b.kind == "comm"]
[('w2', 10.0, 30.0), ('w1', 30.0, 34.0)]
>>> len(to_chrome(tl)["traceEvents"])
13
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pace.analysis import analyze
from pace.errors import InputError
from pace.ir import Trace, Unit
from pace.sim import SimResult

LaneKind = Literal["compute", "comm"]

# Bars that touch (one ends where the next starts) share a lane; float noise below this must not
# open a new one.
_TOUCH_US = 1e-6


@dataclass(frozen=True, kw_only=True, slots=True)
class Bar:
    """One op or one communication unit of one run, placed on a lane.

    ``lane`` counts within its ``kind``. ``phase`` is the op's phase, or ``"comm"``.
    ``depth`` (units only) is in [0, 1]: 0 = the unit feeds the first layer of the next
    forward pass, 1 = the last (or nothing).
    """

    name: str
    kind: LaneKind
    lane: int
    start_us: float
    finish_us: float
    phase: str
    depth: float | None = None
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunTimeline:
    """The bars of one labelled replay."""

    label: str
    policy: str
    iteration_us: float
    compute_lanes: int
    comm_lanes: int
    bars: tuple[Bar, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Timeline:
    """Several runs of the same trace, to be shown on one time axis."""

    model: str
    runs: tuple[RunTimeline, ...]

    @property
    def span_us(self) -> float:
        return max((r.iteration_us for r in self.runs), default=0.0)


def build_timeline(trace: Trace, runs: Mapping[str, SimResult]) -> Timeline:
    """Lay out every op and communication unit of each run on lanes.

    ``runs`` maps a label (shown in titles and as the Chrome process name) to a replay of
    ``trace``; their order is the panel order. Raises ``InputError`` if ``runs`` is empty or a
    result was not replayed on this trace (its op or tensor counts differ).
    """
    if not runs:
        raise InputError("build_timeline needs at least one run", field="runs")
    tensor_depth = _tensor_depths(trace)
    out = []
    for label, res in runs.items():
        if len(res.tensor_done_us) != len(trace.tensors) or len(res.op_start_us) != len(trace.ops):
            raise InputError(
                f"run {label!r} was not replayed on trace {trace.model!r}: "
                f"{len(res.op_start_us)} ops and {len(res.tensor_done_us)} tensors, "
                f"the trace has {len(trace.ops)} and {len(trace.tensors)}"
            )
        out.append(_run_timeline(trace, label, res, tensor_depth))
    return Timeline(model=trace.model, runs=tuple(out))


def _run_timeline(
    trace: Trace, label: str, res: SimResult, tensor_depth: Mapping[str, float]
) -> RunTimeline:
    op_starts, op_finishes = res.op_start_us, res.op_finish_us
    op_lanes, n_compute = _pack(list(zip(op_starts, op_finishes, strict=True)))
    unit_lanes, n_comm = _pack(list(zip(res.unit_start_us, res.unit_finish_us, strict=True)))
    bars: list[Bar] = [
        Bar(
            name=op.name,
            kind="compute",
            lane=lane,
            start_us=start,
            finish_us=finish,
            phase=op.phase,
            args={"op": op.name, "phase": op.phase, "duration_us": op.duration_us},
        )
        for op, start, finish, lane in zip(trace.ops, op_starts, op_finishes, op_lanes, strict=True)
    ]
    sizes = {t.name: t.size_bytes for t in trace.tensors}
    for index, (unit, start, finish, lane) in enumerate(
        zip(res.units, res.unit_start_us, res.unit_finish_us, unit_lanes, strict=True)
    ):
        names = unit.tensors
        bars.append(
            Bar(
                name=_unit_name(unit, sizes),
                kind="comm",
                lane=lane,
                start_us=start,
                finish_us=finish,
                phase="comm",
                depth=min((tensor_depth.get(n, 1.0) for n in names), default=1.0),
                args={
                    "unit": index,
                    "priority": unit.priority,
                    "bytes": unit.size_bytes,
                    "tensors": list(names),
                    "slices": len(unit.slices),
                },
            )
        )
    return RunTimeline(
        label=label,
        policy=res.policy,
        iteration_us=res.iteration_us,
        compute_lanes=n_compute,
        comm_lanes=n_comm,
        bars=tuple(bars),
    )


def _unit_name(unit: Unit, sizes: Mapping[str, int]) -> str:
    names = unit.tensors
    first = names[0] if names else "(empty unit)"
    if len(names) > 1:
        return f"{first} +{len(names) - 1}"
    if len(unit.slices) == 1 and unit.slices[0].size_bytes < sizes.get(first, 0):
        s = unit.slices[0]
        return f"{first}[{s.offset_bytes}:{s.offset_bytes + s.size_bytes}]"
    return first


def _pack(intervals: Sequence[tuple[float, float]]) -> tuple[list[int], int]:
    """Lane of each interval, and the lane count (greedy interval partitioning).

    Taking intervals by start time and putting each on the lowest free lane opens a new lane
    only when every lane is busy at that start, so the count equals the maximum overlap.
    """
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], intervals[i][1], i))
    lane_end: list[float] = []
    lanes = [0] * len(intervals)
    for i in order:
        start, finish = intervals[i]
        lane = next((k for k, end in enumerate(lane_end) if end <= start + _TOUCH_US), None)
        if lane is None:
            lane = len(lane_end)
            lane_end.append(finish)
        lane_end[lane] = max(finish, start)
        lanes[i] = lane
    return lanes, len(lane_end)


def _tensor_depths(trace: Trace) -> dict[str, float]:
    """Each tensor's rank, in [0, 1], by the compute-only earliest start of its first consumer.

    The ranks come from the trace alone (no communication), so the colours mean the same in
    every run being compared.
    """
    need = analyze(trace).need_us
    keyed = sorted((need[k], k, t.name) for k, t in enumerate(trace.tensors))
    n = len(keyed)
    return {name: (rank / (n - 1) if n > 1 else 0.0) for rank, (_, _, name) in enumerate(keyed)}


# ---------------------------------------------------------------------------------------------
# Chrome / Perfetto trace


def to_chrome(timeline: Timeline, *, trace: Trace | None = None) -> dict[str, Any]:
    """The timeline as a Trace Event Format object (``json.dump`` it).

    One process per run (``pid`` 1, 2, ... in run order), one thread per lane (compute lanes
    first, then communication lanes), a complete event (``ph`` ``"X"``, ``ts``/``dur`` in
    microseconds) per op and per unit, ``M`` events naming processes and threads, and a
    process-wide instant event ``"iteration end"`` at each run's ``iteration_us``.

    Events also carry what ``torch.profiler`` writes for GPU work, so Holistic Trace Analysis
    reads the file as a (predicted) rank beside measured ones: every bar has ``args.stream`` (its
    lane) and ``args.device``; a unit is named like NCCL's all-reduce kernel
    (``ncclDevKernel_AllReduce_Sum_f32_RING_LL(<tensors>)``) and carries the profiler's
    collective keys (``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``dtype``,
    ``Group size``, ...); the file has ``distributedInfo`` (rank 0). ``trace`` (the trace the
    runs replayed) gives the element type and the group size; without it a unit counts bytes.
    """
    kinds = {t.name: t.fusion_kind for t in trace.tensors} if trace is not None else {}
    workers = trace.comm.workers if trace is not None else 1
    events: list[dict[str, Any]] = []
    for pid, run in enumerate(timeline.runs, start=1):
        events.append(_meta("process_name", pid, 0, name=f"{_run_name(run)}: {_ms(run)} ms"))
        events.append(_meta("process_sort_index", pid, 0, sort_index=pid))
        for lane in range(run.compute_lanes):
            tid = _tid(run, "compute", lane)
            events.append(_meta("thread_name", pid, tid, name=_lane_name(run, "compute", lane)))
            events.append(_meta("thread_sort_index", pid, tid, sort_index=tid))
        for lane in range(run.comm_lanes):
            tid = _tid(run, "comm", lane)
            events.append(_meta("thread_name", pid, tid, name=_lane_name(run, "comm", lane)))
            events.append(_meta("thread_sort_index", pid, tid, sort_index=tid))
        for bar in sorted(run.bars, key=lambda b: (b.start_us, b.kind, b.lane)):
            tid = _tid(run, bar.kind, bar.lane)
            args = {**bar.args, "stream": tid, "device": 0}
            name = bar.name
            if bar.kind == "comm":
                name, collective = _collective(bar, kinds, workers)
                args.update(collective)
            events.append(
                {
                    "name": name,
                    "cat": bar.phase,
                    "ph": "X",
                    "ts": bar.start_us,
                    "dur": bar.finish_us - bar.start_us,
                    "pid": pid,
                    "tid": tid,
                    "args": args,
                }
            )
        events.append(
            {
                "name": "iteration end",
                "cat": "iteration",
                "ph": "i",
                "s": "p",
                "ts": run.iteration_us,
                "pid": pid,
                "tid": 1,
                "args": {"iteration_us": run.iteration_us},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": workers},
        "otherData": {"model": timeline.model, "generator": "pace timeline"},
    }


# Element size -> (the dtype NCCL kernel names use, the ScalarType name torch.profiler writes).
_NCCL_TYPES: dict[int, tuple[str, str]] = {
    4: ("f32", "Float"),
    2: ("f16", "Half"),
    8: ("f64", "Double"),
    1: ("u8", "Byte"),
}
# Where the trace records the dtype: the one element size cannot tell (float16 and bfloat16).
_NCCL_DTYPES: dict[str, tuple[str, str]] = {"bfloat16": ("bf16", "BFloat16")}


def _collective(
    bar: Bar, kinds: Mapping[str, tuple[int, str]], workers: int
) -> tuple[str, dict[str, Any]]:
    """A unit's kernel name and the collective args ``torch.profiler`` gives NCCL kernels.

    One element type for the unit: its tensors' common dtype where the trace records it and the
    element size alone cannot tell it (bfloat16), else their common element size (2 bytes reads
    as Half), else bytes.
    """
    found = {kinds.get(t, (1, "")) for t in bar.args.get("tensors", ())}
    size, dtype = found.pop() if len(found) == 1 else (1, "")
    if size not in _NCCL_TYPES:
        size = 1
    short, scalar = _NCCL_DTYPES.get(dtype, _NCCL_TYPES[size])
    nbytes = int(bar.args.get("bytes", 0))
    nelems = nbytes // size
    return f"ncclDevKernel_AllReduce_Sum_{short}_RING_LL({bar.name})", {
        "Collective name": "allreduce",
        "In msg nelems": nelems,
        "Out msg nelems": nelems,
        "In split size": "[]",
        "Out split size": "[]",
        "Group size": workers,
        "dtype": scalar,
        "Process Group Name": "0",
        "Process Group Description": "default_pg",
        "Process Group Ranks": str(list(range(workers))),
        "Rank": 0,
    }


def _tid(run: RunTimeline, kind: LaneKind, lane: int) -> int:
    return 1 + lane + (run.compute_lanes if kind == "comm" else 0)


def _lane_name(run: RunTimeline, kind: LaneKind, lane: int) -> str:
    count = run.compute_lanes if kind == "compute" else run.comm_lanes
    return kind if count == 1 else f"{kind} {lane + 1}"


def _meta(what: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"name": what, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _run_name(run: RunTimeline) -> str:
    return run.label if run.label == run.policy else f"{run.label} ({run.policy})"


def _ms(run: RunTimeline) -> str:
    return f"{run.iteration_us / 1e3:.3f}"


# ---------------------------------------------------------------------------------------------
# PNG

_PHASE_COLOURS = {
    "forward": "#4C78A8",
    "backward": "#F58518",
    "optimizer": "#54A24B",
    "other": "#9D9D9D",
}
_COMM_CMAP = "viridis"


def render_png(timeline: Timeline, path: str | Path, *, width_in: float = 14.0) -> None:
    """Write :func:`figure` of ``timeline`` to ``path`` as a PNG (whatever its suffix).

    Raises ``ImportError`` naming the extra if matplotlib is missing, ``InputError`` if ``path``
    cannot be written. The file is replaced atomically (``pace.io.write_atomic``).
    """
    from pace.io import write_atomic

    fig = figure(timeline, width_in=width_in)
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format="png")
    write_atomic(path, png.getvalue())


def figure(timeline: Timeline, *, width_in: float = 14.0) -> Any:
    """The Gantt chart as a matplotlib ``Figure`` (Agg canvas): one panel per run, sharing the
    time axis; the last axes is the colour bar.

    Compute lanes on top (coloured by phase), communication lanes below (coloured by the depth
    of the layer each unit feeds), a dashed line at each run's iteration time, which the panel
    title also gives. Needs matplotlib (``pip install 'pace[plot]'``): raises ``ImportError``
    saying so.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise ImportError(
            "PNG timelines need matplotlib: pip install 'pace[plot]' "
            "(the Chrome trace format needs nothing extra)"
        ) from exc
    import matplotlib as mpl

    # Microseconds for short windows (the worked examples), milliseconds for real models.
    scale, unit = (1e3, "ms") if timeline.span_us >= 10_000 else (1.0, "us")
    cmap = mpl.colormaps[_COMM_CMAP]
    heights = [r.compute_lanes + r.comm_lanes + 1.2 for r in timeline.runs]
    fig = Figure(figsize=(width_in, 1.2 + 0.42 * sum(heights)), layout="constrained")
    FigureCanvasAgg(fig)  # Agg renders to files only: no display, no pyplot global state
    axes = fig.subplots(len(timeline.runs), 1, sharex=True, height_ratios=heights, squeeze=False)
    reference = timeline.runs[0]
    phases_seen: dict[str, None] = {}
    for ax, run in zip(axes[:, 0], timeline.runs, strict=True):
        n_lanes = run.compute_lanes + run.comm_lanes
        # Compute lanes from the top down, then communication lanes.
        rows: dict[tuple[LaneKind, int], int] = {
            ("compute", i): n_lanes - 1 - i for i in range(run.compute_lanes)
        }
        rows.update({("comm", i): run.comm_lanes - 1 - i for i in range(run.comm_lanes)})
        per_row: dict[int, tuple[list[tuple[float, float]], list[Any]]] = {
            y: ([], []) for y in rows.values()
        }
        for bar in run.bars:
            y = rows[(bar.kind, bar.lane)]
            spans, colours = per_row[y]
            spans.append((bar.start_us / scale, (bar.finish_us - bar.start_us) / scale))
            if bar.kind == "comm":
                colours.append(cmap(bar.depth if bar.depth is not None else 1.0))
            else:
                colours.append(_PHASE_COLOURS.get(bar.phase, _PHASE_COLOURS["other"]))
                phases_seen[bar.phase] = None
        for y, (spans, colours) in per_row.items():
            if spans:
                ax.broken_barh(
                    spans,
                    (y - 0.4, 0.8),
                    facecolors=colours,
                    edgecolors="white",
                    linewidths=0.15,
                )
        ax.axvline(run.iteration_us / scale, color="#D62728", linestyle="--", linewidth=1.2)
        ax.set_yticks(
            [rows[k] for k in rows],
            [_lane_name(run, kind, lane) for kind, lane in rows],
        )
        ax.set_ylim(-0.7, n_lanes - 0.3)
        title = f"{_run_name(run)}: iteration {run.iteration_us / scale:.4g} {unit}"
        if run is not reference and run.iteration_us > 0:
            title += f"   {reference.iteration_us / run.iteration_us:.3f}x vs {reference.label}"
        ax.set_title(title, loc="left", fontsize=11)
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_axisbelow(True)
    axes[-1, 0].set_xlabel(f"time ({unit})")
    axes[-1, 0].set_xlim(0, timeline.span_us / scale * 1.01)
    handles: list[Any] = [
        Patch(color=_PHASE_COLOURS.get(p, _PHASE_COLOURS["other"]), label=p) for p in phases_seen
    ]
    handles.append(Line2D([], [], color="#D62728", linestyle="--", label="iteration end"))
    fig.legend(handles=handles, loc="outside upper right", ncols=len(handles), fontsize=9)
    mappable = ScalarMappable(norm=Normalize(0.0, 1.0), cmap=cmap)
    colourbar = fig.colorbar(mappable, ax=axes[:, 0].tolist(), fraction=0.03, pad=0.01)
    colourbar.set_label("comm unit: layer it feeds\n(0 = input side, needed first)", fontsize=9)
    fig.suptitle(f"{timeline.model}: compute and communication", x=0.01, ha="left")
    return fig
