"""pace vs the *best-tuned* baselines: BO (scikit-optimize) over ByteScheduler's partition/credit
and Horovod's fusion threshold/cycle time on the simulator, for every shipped trace.

The shipped traces were profiled on a CPU (compute-bound); each is also run with compute scaled
to 1.5x its total all-reduce time (8 workers, 10 Gbps ring), where scheduling matters.

Usage: .venv/bin/python benchmarks/bench_tune.py [--calls 30] [--ratio 1.5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.drift_scenario import balance_compute  # noqa: E402
from benchmarks.drift_tune import tune  # noqa: E402
from pace.compiler import compile_trace  # noqa: E402
from pace.io import load_trace  # noqa: E402
from pace.sim import simulate  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--ratio", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    cols = [
        "trace",
        "pace",
        "bytescheduler default",
        "bytescheduler BO",
        "BO knobs (partition, credit)",
        "bytescheduler grid",
        "horovod default",
        "horovod BO",
        "BO knobs (threshold, cycle)",
        "pace vs best baseline",
        "BO s",
    ]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for path in sorted((ROOT / "traces").glob("*.json.gz")):
        raw = load_trace(path)
        balanced, _ = balance_compute(raw, args.ratio)
        for label, trace in ((f"{path.name.split('.')[0]}", raw), (f"  … ×{args.ratio}", balanced)):
            pace_us = compile_trace(trace, baselines=False).predicted_iteration_us
            t0 = time.perf_counter()
            bs = tune(trace, "bytescheduler", n_calls=args.calls, seed=args.seed)
            hv = tune(trace, "horovod", n_calls=args.calls, seed=args.seed)
            seconds = time.perf_counter() - t0
            grid = simulate(trace, "bytescheduler-tuned").iteration_us
            best = min(bs.iteration_us, hv.iteration_us, grid)
            row = [
                label,
                f"{pace_us / 1e3:.1f}",
                f"{bs.default_us / 1e3:.1f}",
                f"{bs.iteration_us / 1e3:.1f}",
                f"{bs.knobs['partition_bytes'] / 2**20:.2f} MiB, {int(bs.knobs['credit_units'])}",
                f"{grid / 1e3:.1f}",
                f"{hv.default_us / 1e3:.1f}",
                f"{hv.iteration_us / 1e3:.1f}",
                f"{hv.knobs['threshold_bytes'] / 2**20:.1f} MiB, "
                f"{hv.knobs['cycle_us'] / 1e3:.2f} ms",
                f"{100 * (pace_us / best - 1):+.1f}%",
                f"{seconds:.1f}",
            ]
            print("| " + " | ".join(row) + " |", flush=True)
    print()
    print("(iteration times in ms, simulator replay; negative = pace faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
