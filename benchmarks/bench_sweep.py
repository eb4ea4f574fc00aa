"""Simulation study (PACE Fig. 8/9): pace vs every baseline over bandwidth x workers.

    python benchmarks/bench_sweep.py [--traces vgg16,resnet50,transformer,lstm_seq2seq]
        [--bandwidths 1,5,10,25,100] [--workers 2,4,8,16,64]
        [--compute-speedup calibrated,30] [--latency-us 50] [--jobs 2] [--markdown] [--plot DIR]

For every shipped real trace (``traces/``) and every point of the grid, the trace's all-reduce
cost becomes the ring model of PACE Eqn. 1 at that bandwidth and worker count (plus the trace's
per-call latency: ``pace.compiler.apply_what_if`` / ``pace.cost.what_if``), pace compiles it
afresh (``pace.compiler.compile_trace``, the default pipeline: the comm model changed, so does the
schedule) and every simulator baseline is replayed on the same trace object, with the lower bound.
All times are simulator replays (docs/schedule-format.md semantics).

Compute scale (``--compute-speedup``): the traces were profiled on one CPU core, where an iteration
takes seconds and any all-reduce hides. ``calibrated`` divides each trace's op durations so that
its compute-only iteration takes what the paper's GPU (GTX 1080 Ti, PACE Sec. VI-B) would need for
the paper's per-GPU batch (``CALIBRATION``, ``gpu_target_us``); a number ``X`` divides every
trace's durations by ``X`` (the uniform scale of README/bench_models), to show the sensitivity.
``--latency-us`` replaces every trace's per-call all-reduce latency (the shipped traces carry a
default 50 us, not a measurement of the paper's cluster), the knob on which fusion's value rests.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (
    BASELINES,
    SHARED_CHANNEL,
    TRACES,
    compute_only_us,
    geomean,
    load_shipped,
)
from pace.compiler import compile_trace
from pace.io import write_atomic
from pace.ir import Trace

BANDWIDTHS_GBPS: tuple[float, ...] = (1.0, 5.0, 10.0, 25.0, 100.0)
WORKERS: tuple[int, ...] = (2, 4, 8, 16, 64)
CALIBRATED = "calibrated"
DEFAULT_SCALES: tuple[str, ...] = (CALIBRATED, "30")

# The figures slice the grid as the paper does: Fig. 8 varies the workers on a 10 Gbps network;
# Fig. 9 varies the bandwidth with 12 workers, which is not in the grid, so we use 16.
FIG8_BANDWIDTH_GBPS = 10.0
FIG9_WORKERS = 16

# Every baseline of bench_models plus ``horovod-old``: Horovod's fusion defaults before 0.28
# (64 MiB / 5 ms, docs/baselines.md), the Horovod of the paper's 2019 testbed.
REPORTED: tuple[str, ...] = (*BASELINES[:2], "horovod-old", *BASELINES[2:])
# Columns of the condensed tables: the paper's three baselines (WFBP = FIFO, Horovod, TicTac)
# and ByteScheduler, then the best of all baselines at that point.
HEADLINE: tuple[str, ...] = ("fifo", "horovod", "horovod-old", "tictac", "bytescheduler")
LABEL = {
    "fifo": "WFBP/FIFO",
    "horovod": "Horovod",
    "horovod-old": "Horovod-old",
    "tictac": "TicTac",
    "bytescheduler": "ByteScheduler",
    "bytescheduler-tuned": "BS-tuned",
}

# --- Compute calibration ----------------------------------------------------------------------
# One measured anchor: ResNet-50 trains at 209 images/s (fp32, synthetic data) on a GTX 1080 Ti
# in Lambda Labs' published TensorFlow 1.12 GPU benchmarks (2019), the GPU of the PACE testbed.
# With the training FLOPs of our ResNet-50 (benchmarks/model_flops.py: 777.57 GFLOP per iteration
# of 32 images) that is an effective 5.08 TFLOP/s (45% of the card's 11.3 TFLOP/s fp32 peak).
# ASSUMPTION: every model trains at that same effective rate. It is not exact: 3x3 convolutions
# (all of VGG16) run faster than that under cuDNN's Winograd kernels and LSTMs slower, so VGG16's
# compute is probably over- and Seq2Seq's under-estimated; the uniform x30 run shows how much the
# conclusions move with the compute scale.
ANCHOR_IMAGES_PER_S = 209.0
ANCHOR_GFLOP_PER_IMAGE = 777.57 / 32
GPU_GFLOP_PER_S = ANCHOR_IMAGES_PER_S * ANCHOR_GFLOP_PER_IMAGE


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """How one shipped trace is scaled to a GPU-class compute time.

    ``train_gflop``: training FLOPs of one profiled iteration (``benchmarks/model_flops.py``).
    ``batch_scale``: the paper's per-GPU batch (PACE Sec. VI-B: 64, 32, 4096 and 2048 samples for
    VGG16, ResNet-50, Seq2Seq and Transformer; tokens for the two sequence models, whose speed the
    paper reports in tokens/s) over the trace's batch (traces/README.md). Compute is taken as
    linear in the batch.
    """

    train_gflop: float
    batch_scale: float
    source: str


CALIBRATION: dict[str, Calibration] = {
    "vgg16": Calibration(
        train_gflop=741.19, batch_scale=64 / 8, source="paper batch 64 images; trace 8 images"
    ),
    "resnet50": Calibration(
        train_gflop=777.57, batch_scale=32 / 32, source="paper batch 32 images; trace 32 images"
    ),
    "transformer": Calibration(
        train_gflop=287.09,
        batch_scale=2048 / (16 * 64),
        source="paper batch 2048 tokens; trace 16 x 64 tokens",
    ),
    "lstm_seq2seq": Calibration(
        train_gflop=153.14,
        batch_scale=4096 / (32 * 32),
        source="paper batch 4096 tokens; trace 32 x 32 target tokens",
    ),
}


def gpu_target_us(name: str) -> float:
    """Compute-only iteration of trace ``name`` on the paper's GPU at the paper's batch, in us."""
    cal = CALIBRATION[name]
    return cal.train_gflop * cal.batch_scale / GPU_GFLOP_PER_S * 1e6


def calibrated_speedup(name: str, trace: Trace) -> float:
    """The ``--compute-speedup`` that gives ``trace`` its GPU-class compute-only iteration."""
    if name not in CALIBRATION:
        raise KeyError(f"no calibration for trace {name!r}; give a number (--compute-speedup 30)")
    return compute_only_us(trace) / gpu_target_us(name)


# --- The sweep --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    """One grid point to compile and replay."""

    trace: str
    scale: str  # "calibrated" or the uniform speed-up as given, e.g. "30"
    compute_speedup: float
    bandwidth_gbps: float
    workers: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    """The outcome of one grid point (all times in us, on the what-if trace)."""

    task: Task
    compute_us: float
    bound_us: float
    pace_us: float
    baselines_us: Mapping[str, float]
    warnings: tuple[str, ...] = ()

    def speedup(self, baseline: str) -> float:
        """Baseline's iteration time over pace's (> 1: pace is faster; paper's 36% = 1.36)."""
        return self.baselines_us[baseline] / self.pace_us

    @property
    def best_baseline(self) -> str:
        """The fastest of the reported baselines at this point."""
        return min(REPORTED, key=self.baselines_us.__getitem__)

    @property
    def gap(self) -> float:
        """pace's relative distance above the lower bound (0: provably optimal)."""
        return self.pace_us / self.bound_us - 1.0 if self.bound_us > 0 else 0.0


def sweep_point(trace: Trace, task: Task) -> Point:
    """Compile ``trace`` for ``task``'s cluster and replay every baseline there."""
    res = compile_trace(
        trace,
        bandwidth_gbps=task.bandwidth_gbps,
        workers=task.workers,
        compute_speedup=task.compute_speedup,
    )
    return Point(
        task=task,
        compute_us=compute_only_us(res.trace),
        bound_us=res.lower_bound_us,
        pace_us=res.predicted_iteration_us,
        baselines_us=dict(res.baselines),
        warnings=res.warnings,
    )


def make_tasks(
    traces: Mapping[str, Trace],
    *,
    scales: Sequence[str],
    bandwidths_gbps: Sequence[float],
    workers: Sequence[int],
) -> list[Task]:
    """Every (scale, trace, bandwidth, workers) point, in that nesting order."""
    tasks: list[Task] = []
    for scale in scales:
        for name, trace in traces.items():
            speedup = calibrated_speedup(name, trace) if scale == CALIBRATED else float(scale)
            tasks.extend(
                Task(
                    trace=name,
                    scale=scale,
                    compute_speedup=speedup,
                    bandwidth_gbps=bw,
                    workers=w,
                )
                for bw in bandwidths_gbps
                for w in workers
            )
    return tasks


_POOL_TRACES: dict[str, Trace] = {}


def _init_pool(traces: Mapping[str, Trace]) -> None:
    _POOL_TRACES.update(traces)


def _pool_point(task: Task) -> Point:
    return sweep_point(_POOL_TRACES[task.trace], task)


def run_sweep(
    traces: Mapping[str, Trace],
    tasks: Sequence[Task],
    *,
    jobs: int = 1,
    on_done: Callable[[Point], None] | None = None,
) -> list[Point]:
    """``sweep_point`` for every task, in task order; ``jobs`` > 1 uses a process pool (max 2)."""
    jobs = max(1, min(jobs, 2))  # the CI machine has 2 cores shared with other jobs
    if jobs == 1:
        out = []
        for task in tasks:
            out.append(sweep_point(traces[task.trace], task))
            if on_done is not None:
                on_done(out[-1])
        return out
    with ProcessPoolExecutor(max_workers=jobs, initializer=_init_pool, initargs=(traces,)) as ex:
        points = []
        for point in ex.map(_pool_point, tasks, chunksize=1):
            points.append(point)
            if on_done is not None:
                on_done(point)
        return points


# --- Reporting --------------------------------------------------------------------------------


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}%"


def _where(p: Point) -> str:
    return f"{p.task.bandwidth_gbps:g}G/{p.task.workers}w"


def time_rows(points: Iterable[Point]) -> tuple[list[str], list[list[str]]]:
    """Iteration times (ms) of pace, the bound and every baseline at every point."""
    cols = ["trace", "Gbps", "workers", "compute", "bound", "pace", *REPORTED]
    rows = [
        [
            p.task.trace,
            f"{p.task.bandwidth_gbps:g}",
            str(p.task.workers),
            f"{p.compute_us / 1e3:.1f}",
            f"{p.bound_us / 1e3:.1f}",
            f"{p.pace_us / 1e3:.1f}",
            *(f"{p.baselines_us[b] / 1e3:.1f}" for b in REPORTED),
        ]
        for p in points
    ]
    return cols, rows


def speedup_rows(points: Iterable[Point]) -> tuple[list[str], list[list[str]]]:
    """Speed-up of pace over each baseline (baseline / pace - 1) and the gap to the bound."""
    cols = [
        "trace",
        "Gbps",
        "workers",
        "pace ms",
        *(f"vs {LABEL.get(b, b)}" for b in REPORTED),
        "vs best",
        "gap to bound",
    ]
    rows = [
        [
            p.task.trace,
            f"{p.task.bandwidth_gbps:g}",
            str(p.task.workers),
            f"{p.pace_us / 1e3:.1f}",
            *(_pct(p.speedup(b)) for b in REPORTED),
            f"{_pct(p.speedup(p.best_baseline))} ({LABEL.get(p.best_baseline, p.best_baseline)})",
            f"{p.gap * 100:.2f}%",
        ]
        for p in points
    ]
    return cols, rows


def _argmax(points: Sequence[Point], baseline: str) -> Point:
    return max(points, key=lambda p: p.speedup(baseline))


def summary_rows(points: Sequence[Point]) -> tuple[list[str], list[list[str]]]:
    """Per trace: compute scale, the largest speed-up over each headline baseline and where."""
    cols = [
        "trace",
        "compute x",
        "compute ms",
        *(f"max vs {LABEL.get(b, b)}" for b in HEADLINE),
        "max vs best",
        "geomean vs best",
        "max gap",
    ]
    rows = []
    for name in dict.fromkeys(p.task.trace for p in points):
        pts = [p for p in points if p.task.trace == name]
        cells = [name, f"{pts[0].task.compute_speedup:.1f}", f"{pts[0].compute_us / 1e3:.1f}"]
        for b in HEADLINE:
            top = _argmax(pts, b)
            cells.append(f"{_pct(top.speedup(b))} ({_where(top)})")
        top = max(pts, key=lambda p: p.speedup(p.best_baseline))
        cells.append(f"{_pct(top.speedup(top.best_baseline))} ({_where(top)})")
        cells.append(_pct(geomean(p.speedup(p.best_baseline) for p in pts)))
        cells.append(f"{max(p.gap for p in pts) * 100:.2f}%")
        rows.append(cells)
    return cols, rows


def paper_rows(points: Sequence[Point]) -> tuple[list[str], list[list[str]]]:
    """The paper's Fig. 8 claim, our way: range over workers of the speed-up at 10 Gbps."""
    paper = ("fifo", "horovod", "horovod-old", "tictac")
    cols = ["trace", *(f"vs {LABEL.get(b, b)}" for b in paper)]
    rows = []
    for name in dict.fromkeys(p.task.trace for p in points):
        pts = [
            p
            for p in points
            if p.task.trace == name and p.task.bandwidth_gbps == FIG8_BANDWIDTH_GBPS
        ]
        if not pts:
            continue
        cells = [name]
        for b in paper:
            vals = [p.speedup(b) for p in pts]
            cells.append(f"{_pct(min(vals))} .. {_pct(max(vals))}")
        rows.append(cells)
    return cols, rows


def violations(points: Iterable[Point]) -> list[str]:
    """Points where a one-channel baseline replays faster than pace (the compile guarantee)."""
    out = []
    for p in points:
        for b, us in p.baselines_us.items():
            if b not in SHARED_CHANNEL and us < p.pace_us * (1 - 1e-9):
                out.append(f"{p.task.trace} {_where(p)} {p.task.scale}: {b} {us:.1f} < {p.pace_us}")
    return out


def _markdown(cols: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines.extend("| " + " | ".join(r) + " |" for r in rows)
    return "\n".join(lines)


def _scale_title(scale: str) -> str:
    if scale == CALIBRATED:
        return "compute calibrated to a GTX 1080 Ti at the paper's batch sizes"
    return f"compute x{scale} (uniform)"


def print_markdown(points: Sequence[Point], *, note: str = "") -> None:
    for scale in dict.fromkeys(p.task.scale for p in points):
        pts = [p for p in points if p.task.scale == scale]
        print(f"### {_scale_title(scale)}{note}\n")
        print(_markdown(*summary_rows(pts)))
        print(f"\nSpeed-up range over workers at {FIG8_BANDWIDTH_GBPS:g} Gbps (paper Fig. 8):\n")
        print(_markdown(*paper_rows(pts)))
        print("\n<details><summary>Speed-up of pace at every point</summary>\n")
        print(_markdown(*speedup_rows(pts)))
        print("\n</details>\n\n<details><summary>Iteration times (ms) at every point</summary>\n")
        print(_markdown(*time_rows(pts)))
        print("\n</details>\n")


def print_rich(points: Sequence[Point], *, note: str = "") -> None:
    from rich.console import Console
    from rich.table import Table

    # The tables are wide: outside a terminal (a pipe, a log file) do not wrap them at 80 columns.
    console = Console(width=None if sys.stdout.isatty() else 220)
    for scale in dict.fromkeys(p.task.scale for p in points):
        pts = [p for p in points if p.task.scale == scale]
        for title, (cols, rows) in (
            (f"iteration time (ms), {_scale_title(scale)}{note}", time_rows(pts)),
            (
                f"speed-up of pace (baseline / pace - 1), {_scale_title(scale)}{note}",
                speedup_rows(pts),
            ),
            (f"summary, {_scale_title(scale)}{note}", summary_rows(pts)),
            (f"range at {FIG8_BANDWIDTH_GBPS:g} Gbps over workers (paper Fig. 8)", paper_rows(pts)),
        ):
            table = Table(title=title)
            for i, c in enumerate(cols):
                table.add_column(c, justify="left" if i == 0 else "right")
            for r in rows:
                table.add_row(*r)
            console.print(table)


# --- Figures ----------------------------------------------------------------------------------


def plot(points: Sequence[Point], out_dir: Path, *, note: str = "", suffix: str = "") -> list[Path]:
    """Speed-up vs workers (at 10 Gbps, Fig. 8) and vs bandwidth (16 workers, Fig. 9) per scale.

    Writes ``sweep_workers_<scale><suffix>.png`` and ``sweep_bandwidth_<scale><suffix>.png``
    (``note`` is added to the titles); returns the paths. A slice missing from the grid is skipped.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for scale in dict.fromkeys(p.task.scale for p in points):
        pts = [p for p in points if p.task.scale == scale]
        names = list(dict.fromkeys(p.task.trace for p in pts))
        slices: tuple[tuple[str, str, Callable[[Point], bool], Callable[[Point], float]], ...] = (
            (
                "workers",
                f"workers (ring, {FIG8_BANDWIDTH_GBPS:g} Gbps)",
                lambda p: p.task.bandwidth_gbps == FIG8_BANDWIDTH_GBPS,
                lambda p: float(p.task.workers),
            ),
            (
                "bandwidth",
                f"bandwidth, Gbps ({FIG9_WORKERS} workers)",
                lambda p: p.task.workers == FIG9_WORKERS,
                lambda p: p.task.bandwidth_gbps,
            ),
        )
        for key, xlabel, keep, xval in slices:
            sel = [p for p in pts if keep(p)]
            if len({xval(p) for p in sel}) < 2:
                continue
            cols = min(len(names), 2)
            nrows = (len(names) + cols - 1) // cols
            fig, axes = plt.subplots(
                nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False, sharey=True
            )
            for ax, name in zip(axes.flat, names, strict=False):
                mine = sorted((p for p in sel if p.task.trace == name), key=xval)
                xs = [xval(p) for p in mine]
                for b in REPORTED:
                    ax.plot(
                        xs,
                        [(p.speedup(b) - 1) * 100 for p in mine],
                        marker="o",
                        markersize=3,
                        label=LABEL.get(b, b),
                    )
                ax.axhline(0.0, color="grey", linewidth=0.6)
                ax.set_xscale("log")
                ax.set_xticks(xs, [f"{x:g}" for x in xs])
                ax.minorticks_off()
                ax.set_title(f"{name} (compute x{mine[0].task.compute_speedup:.1f})", fontsize=9)
                ax.set_xlabel(xlabel, fontsize=8)
                ax.set_ylabel("pace speed-up over baseline, %", fontsize=8)
                ax.tick_params(labelsize=7)
                ax.grid(alpha=0.3)
            for ax in list(axes.flat)[len(names) :]:
                ax.set_visible(False)
            handles, labels = axes.flat[0].get_legend_handles_labels()
            fig.legend(handles, labels, loc="lower center", ncol=len(REPORTED), fontsize=7)
            fig.suptitle(f"pace vs baselines, {_scale_title(scale)}{note}", fontsize=10)
            fig.tight_layout(rect=(0, 0.05, 1, 1))
            path = (
                out_dir
                / f"sweep_{key}_{'calibrated' if scale == CALIBRATED else 'x' + scale}{suffix}.png"
            )
            png = io.BytesIO()
            fig.savefig(png, dpi=100, format="png")
            plt.close(fig)
            write_atomic(path, png.getvalue())  # a reader never sees half a figure
            written.append(path)
    return written


# --- CLI --------------------------------------------------------------------------------------


def with_latency(trace: Trace, latency_us: float) -> Trace:
    """``trace`` with another per-call all-reduce latency (``alpha_us``; the what-if keeps it)."""
    import dataclasses

    comm = dataclasses.replace(trace.comm, alpha_us=latency_us, samples=())
    return dataclasses.replace(trace, comm=comm)


def _load(spec: str) -> tuple[str, Trace]:
    """A shipped trace name, or a path to a trace file (named by its stem)."""
    if spec in TRACES:
        return spec, load_shipped(spec)
    from pace.io import load_trace

    path = Path(spec)
    return path.name.split(".")[0], load_trace(path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--traces", default=",".join(TRACES), help="shipped names or trace files")
    ap.add_argument("--bandwidths", default=",".join(f"{b:g}" for b in BANDWIDTHS_GBPS))
    ap.add_argument("--workers", default=",".join(str(w) for w in WORKERS))
    ap.add_argument(
        "--compute-speedup",
        default=",".join(DEFAULT_SCALES),
        help="comma list of 'calibrated' and/or uniform speed-ups (default: calibrated,30)",
    )
    ap.add_argument(
        "--latency-us",
        type=float,
        help="per-call all-reduce latency (alpha); default: each trace's own (50 us shipped)",
    )
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (at most 2)")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    ap.add_argument("--plot", type=Path, metavar="DIR", help="write the PNG figures there")
    args = ap.parse_args(argv)

    traces = dict(_load(s.strip()) for s in args.traces.split(",") if s.strip())
    note = suffix = ""
    if args.latency_us is not None:
        traces = {n: with_latency(t, args.latency_us) for n, t in traces.items()}
        note, suffix = f", {args.latency_us:g} us per call", f"_lat{args.latency_us:g}"
    scales = [s.strip() for s in args.compute_speedup.split(",") if s.strip()]
    for s in scales:
        if s != CALIBRATED:
            float(s)  # a ValueError here names the bad value
    missing = [n for n in traces if n not in CALIBRATION]
    if CALIBRATED in scales and missing:
        ap.error(f"no compute calibration for {', '.join(missing)}: give --compute-speedup X")
    tasks = make_tasks(
        traces,
        scales=scales,
        bandwidths_gbps=[float(x) for x in args.bandwidths.split(",")],
        workers=[int(x) for x in args.workers.split(",")],
    )
    from tqdm import tqdm

    with tqdm(total=len(tasks), desc="sweep", unit="pt", file=sys.stderr) as bar:
        points = run_sweep(traces, tasks, jobs=args.jobs, on_done=lambda _p: bar.update())

    if args.markdown:
        print_markdown(points, note=note)
    else:
        print_rich(points, note=note)
    bad = violations(points)
    print(f"\n{len(points)} points; one-channel baselines faster than pace: {len(bad)}")
    for line in bad:
        print(f"  {line}")
    if args.plot is not None:
        for path in plot(points, args.plot, note=note, suffix=suffix):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
