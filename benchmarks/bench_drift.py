"""Simulated drift: the link halves at iteration 100 and recovers at 200 (300 iterations, jitter).

Compares, per phase, the mean iteration time of

* pace-replanned        compiled once; trigger (10% for 5 iterations) -> re-estimate -> recompile,
                        switch if the predicted gain > 5%;
* pace-static           compiled once for the initial conditions;
* bytescheduler-autobyte  BO-tuned at start, BO re-tuned on the re-estimated trace on trigger
                        (AutoByte's loop with BO in place of its meta-network; same trigger);
* bytescheduler-bo      BO-tuned at start, then fixed (ByteScheduler as published);
* bytescheduler-default its documented all-reduce defaults.

The shipped traces were profiled on this CPU, where compute dwarfs an 8-worker 10 Gbps ring; the
scenario scales every op duration so that compute = ``--compute-ratio`` x the total all-reduce
time (GPU-like balance; 1.5 by default), which is where scheduling matters at all.

Usage:
  .venv/bin/python benchmarks/bench_drift.py                       # tables on stdout
  .venv/bin/python benchmarks/bench_drift.py --plot docs/img/drift.png --no-jitter-too
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.drift_scenario import (  # noqa: E402
    ScenarioOptions,
    ScenarioResult,
    balance_compute,
    run_scenario,
)
from pace.io import load_trace, write_atomic  # noqa: E402

DEFAULT_TRACES = ("traces/resnet50.json.gz", "traces/transformer.json.gz")


def table(name: str, res: ScenarioResult, steady_skip: int) -> str:
    phases = res.phases()
    head = ["system"]
    for start, stop, f in phases:
        head.append(f"it {start}-{stop - 1} (bw x{f:g})")
    for start, stop, _f in phases:
        head.append(f"steady {start + steady_skip}-{stop - 1}")
    head += ["fired at", "switched at", "plan s (each)"]
    lines = [f"### {name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in res.runs.values():
        cells = [run.name]
        cells += [f"{run.mean_us(a, b) / 1e3:.1f}" for a, b, _ in phases]
        cells += [f"{run.mean_us(min(a + steady_skip, b - 1), b) / 1e3:.1f}" for a, b, _ in phases]
        cells.append(", ".join(map(str, run.fired)) or "-")
        cells.append(", ".join(map(str, run.switches)) or "-")
        cells.append(", ".join(f"{s:.2f}" for s in run.plan_seconds) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("(mean iteration time in ms; 'steady' leaves out the first iterations of a phase)")
    return "\n".join(lines)


def plot(results: list[tuple[str, ScenarioResult]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(10, 3.6 * len(results)), squeeze=False)
    styles = {
        "pace-replanned": {"color": "tab:red", "lw": 1.6},
        "pace-static": {"color": "tab:orange", "lw": 1.0, "ls": "--"},
        "bytescheduler-autobyte": {"color": "tab:blue", "lw": 1.2},
        "bytescheduler-bo": {"color": "tab:cyan", "lw": 1.0, "ls": ":"},
        "bytescheduler-default": {"color": "tab:gray", "lw": 1.0, "ls": "-."},
    }
    for ax, (name, res) in zip(axes[:, 0], results, strict=True):
        for run in res.runs.values():
            ax.plot(
                [t / 1e3 for t in run.iteration_us],
                label=run.name,
                **styles.get(run.name, {}),
            )
            for sw in run.switches:
                ax.axvline(sw, color=styles.get(run.name, {}).get("color", "k"), alpha=0.25)
        for start, _stop, f in res.phases()[1:]:
            ax.axvline(start, color="k", lw=0.8)
            ax.text(start + 1, ax.get_ylim()[1], f" bw x{f:g}", va="top", fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("iteration")
        ax.set_ylabel("iteration time (ms)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=5, loc="lower center")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format="png")
    write_atomic(path, png.getvalue())  # a reader never sees half a figure


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", action="append", help="trace file (repeatable)")
    ap.add_argument("--compute-ratio", type=float, default=1.5)
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tune-calls", type=int, default=20)
    ap.add_argument("--steady-skip", type=int, default=20)
    ap.add_argument("--no-jitter-too", action="store_true", help="also run without jitter")
    ap.add_argument("--plot", type=Path, help="write the per-iteration plot (PNG)")
    ap.add_argument("--json", type=Path, help="write per-iteration times as JSON")
    args = ap.parse_args()

    traces = args.trace or [str(ROOT / t) for t in DEFAULT_TRACES]
    variants: list[tuple[str, ScenarioOptions]] = [
        (
            "jitter (compute 2%, comm 3%, 2% slow steps x1.3)",
            ScenarioOptions(iterations=args.iterations, seed=args.seed, tune_calls=args.tune_calls),
        )
    ]
    if args.no_jitter_too:
        variants.append(
            (
                "no jitter",
                ScenarioOptions(
                    iterations=args.iterations,
                    seed=args.seed,
                    tune_calls=args.tune_calls,
                    compute_jitter=0.0,
                    comm_jitter=0.0,
                    slow_step_prob=0.0,
                ),
            )
        )
    plotted: list[tuple[str, ScenarioResult]] = []
    dump: dict[str, Any] = {}
    for path in traces:
        trace, scale = balance_compute(load_trace(path), args.compute_ratio)
        for label, opts in variants:
            t0 = time.perf_counter()
            res = run_scenario(trace, opts)
            wall = time.perf_counter() - t0
            name = f"{Path(path).name.split('.')[0]} — {label}"
            print(table(name, res, args.steady_skip))
            print(
                f"\n(compute scaled x{scale:.4f}; {trace.comm.workers} workers, "
                f"beta {trace.comm.beta_us_per_byte:.3g} us/B, alpha {trace.comm.alpha_us:g} us; "
                f"scenario wall time {wall:.1f} s)\n"
            )
            if label.startswith("jitter"):
                plotted.append((name, res))
            dump[name] = {r.name: list(r.iteration_us) for r in res.runs.values()}
    if args.plot:
        plot(plotted, args.plot)
        print(f"plot: {args.plot}")
    if args.json:
        write_atomic(args.json, json.dumps(dump).encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
