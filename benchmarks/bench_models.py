"""Headline table: pace vs every baseline on the shipped real-model traces, GPU-like compute.

    python benchmarks/bench_models.py [--speedups 10,30,100] [--bandwidths 10,25] [--workers 8]
                                      [--markdown]

The shipped traces (``traces/*.json.gz``) are real PyTorch profiles taken on this CPU: their
iterations take seconds, which hides any communication, so every policy ties there
(``benchmarks/bench_fusion.py --shipped``). Here each trace is replayed as if its computation ran
``X`` times faster (``--compute-speedup X``: same DAG, same relative op costs, same gradient
sizes) on a ring of ``--workers`` workers at each bandwidth. For every case, in this one process
and on the same trace object: pace (default fusion search), pace with PACE Alg. 1 fusion, pace
without fusion, and every simulator baseline. All numbers are simulator replays
(docs/schedule-format.md semantics) in milliseconds; ``vs horovod`` / ``vs best`` are Horovod's /
the best baseline's time over pace's (``bytescheduler-tuned`` is a grid search over its knobs on
this very trace).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import BASELINES, TRACES, compute_only_us, geomean, load_shipped
from pace.compiler import compile_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--speedups", default="10,30,100")
    ap.add_argument("--bandwidths", default="10,25", help="Gbps")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--markdown", action="store_true", help="print a markdown table instead")
    args = ap.parse_args()
    columns = [
        "compute",
        "bound",
        "pace",
        "paper",
        "no-fusion",
        *BASELINES,
        "vs horovod",
        "vs best",
    ]
    rows: list[list[str]] = []
    gains: list[float] = []
    hvd_gains: list[float] = []
    for name in TRACES:
        trace = load_shipped(name)
        for speedup in (float(x) for x in args.speedups.split(",")):
            for bw in (float(x) for x in args.bandwidths.split(",")):
                kw = {
                    "compute_speedup": speedup,
                    "bandwidth_gbps": bw,
                    "workers": args.workers,
                }
                res = compile_trace(trace, **kw)
                paper = compile_trace(trace, fusion="paper", baselines=False, **kw)
                nofuse = compile_trace(trace, fusion="none", baselines=False, **kw)
                compute_ms = compute_only_us(res.trace) / 1e3
                best = min(res.baselines[b] for b in BASELINES)
                gains.append(best / res.predicted_iteration_us)
                hvd_gains.append(res.baselines["horovod"] / res.predicted_iteration_us)
                rows.append(
                    [
                        f"{name} x{speedup:g} {bw:g}G",
                        f"{compute_ms:.1f}",
                        f"{res.lower_bound_us / 1e3:.1f}",
                        f"{res.predicted_iteration_us / 1e3:.1f}",
                        f"{paper.predicted_iteration_us / 1e3:.1f}",
                        f"{nofuse.predicted_iteration_us / 1e3:.1f}",
                        *(f"{res.baselines[b] / 1e3:.1f}" for b in BASELINES),
                        f"{res.baselines['horovod'] / res.predicted_iteration_us:.3f}x",
                        f"{best / res.predicted_iteration_us:.3f}x",
                    ]
                )
    geo = geomean(gains)
    summary = (
        f"geometric mean speed-up of pace: {geomean(hvd_gains):.3f}x over horovod, "
        f"{geo:.3f}x over the best baseline of each case (max {max(gains):.3f}x, "
        f"min {min(gains):.3f}x)"
    )
    if args.markdown:
        print("| case | " + " | ".join(columns) + " |")
        print("|---" * (len(columns) + 1) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
        print(f"\n{summary}")
        return
    table = Table(title=f"iteration time (ms), {args.workers} workers, ring all-reduce")
    table.add_column("case")
    for c in columns:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*r)
    console = Console()
    console.print(table)
    console.print(summary)


if __name__ == "__main__":
    main()
