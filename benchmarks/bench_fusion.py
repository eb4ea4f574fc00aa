"""Fusion on traces with many tiny tensors and a realistic per-call latency, side by side.

    python benchmarks/bench_fusion.py [--traces 6] [--layers 40] [--alpha-us 20,50] [--shrink 1,32]

Per trace (``pace.synth.random_trace`` with 3-8 tensors per layer: one weight, the rest tiny
biases/norm parameters; ring all-reduce at 10 Gbps for 8 workers; ``--shrink K`` divides every
tensor size by K, so the per-call latency weighs more against the bytes), all in this one process
and on the same trace object: pace with the default fusion search, pace with PACE Alg. 1
(``--fusion paper``), pace without fusion (``--no-fusion``), and the simulator's baselines
(Horovod, DDP, FIFO/WFBP, ByteScheduler). Every number is the simulator's replay
(docs/schedule-format.md semantics), in microseconds; the last table is the geometric-mean
speed-up of pace (search) over each column.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pace.compiler import apply_what_if, compile_trace
from pace.io import load_trace
from pace.ir import Trace
from pace.lp import lower_bound_us
from pace.sim import compare
from pace.synth import random_trace

BASELINES = ("horovod", "ddp", "fifo", "bytescheduler", "bytescheduler-tuned")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--traces", type=int, default=6, help="traces per (alpha, shrink)")
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--alpha-us", default="20,50", help="per-call latencies to try")
    ap.add_argument("--shrink", default="1,32", help="tensor-size divisors to try")
    ap.add_argument(
        "--shipped",
        action="store_true",
        help="instead: the shipped traces (traces/*.json.gz), as measured and what-if 1 / 0.1 Gbps",
    )
    args = ap.parse_args()

    columns = ["search", "paper", "no-fusion", *BASELINES]
    rows = []
    ratios: dict[str, list[float]] = {c: [] for c in columns}
    for label, trace in _cases(args):
        t0 = time.perf_counter()
        us: dict[str, float] = {}
        groups: dict[str, int] = {}
        for column, fusion in (("search", "search"), ("paper", "paper"), ("no-fusion", "none")):
            res = compile_trace(trace, fusion=fusion, baselines=False)
            us[column] = res.predicted_iteration_us
            groups[column] = len(res.plan.groups)
        for name, sim in compare(trace, policies=BASELINES).items():
            us[name] = sim.iteration_us
        bound = lower_bound_us(trace)
        for c in columns:
            ratios[c].append(us[c] / us["search"])
        rows.append(
            [
                label,
                len(trace.tensors),
                f"{groups['search']}/{groups['paper']}",
                round(bound),
                *(round(us[c]) for c in columns),
                round(time.perf_counter() - t0, 2),
            ]
        )
        print(f"done {label}", file=sys.stderr, flush=True)
    _table(
        "iteration time (us, simulator replay); groups = search/paper",
        ["trace", "tensors", "groups", "lower bound", *columns, "s"],
        rows,
    )
    _table(
        "geometric-mean speed-up of pace (search) over each policy",
        ["policy", "speed-up", "search wins or ties"],
        [
            [
                c,
                f"{math.exp(sum(math.log(r) for r in ratios[c]) / len(ratios[c])):.4f}x",
                f"{sum(r >= 1 - 1e-12 for r in ratios[c])}/{len(ratios[c])}",
            ]
            for c in columns
        ],
    )


def _cases(args: argparse.Namespace) -> Iterator[tuple[str, Trace]]:
    if args.shipped:
        root = Path(__file__).resolve().parent.parent / "traces"
        for path in sorted(root.glob("*.json.gz")):
            measured = load_trace(path)
            for gbps in (None, 1.0, 0.1):
                name = path.name.removesuffix(".json.gz")
                label = f"{name} {'measured' if gbps is None else f'{gbps:g} Gbps'}"
                yield label, apply_what_if(measured, bandwidth_gbps=gbps)
        return
    for shrink in (int(k) for k in args.shrink.split(",")):
        for alpha in (float(a) for a in args.alpha_us.split(",")):
            for seed in range(args.traces):
                trace = random_trace(
                    seed=seed,
                    n_layers=args.layers,
                    tensors_per_layer=(3, 8),
                    ops_per_layer=3,
                    alpha_us=alpha,
                )
                if shrink > 1:
                    small = tuple(
                        dataclasses.replace(t, size_bytes=max(4, t.size_bytes // shrink // 4 * 4))
                        for t in trace.tensors
                    )
                    trace = dataclasses.replace(trace, tensors=small)
                yield f"a={alpha:g} k={shrink} s={seed}", trace


def _table(title: str, columns: list[str], rows: list[list[object]]) -> None:
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(*(str(v) for v in r))
    Console(width=220, soft_wrap=False).print(table)


if __name__ == "__main__":
    main()
