"""What one more Horovod collective costs when it is issued beside others: 2 Horovod ranks
(gloo, CPU, loopback) all-reduce ``k`` tiny tensors issued at once (``allreduce_async_`` each,
then ``synchronize`` on every handle, as ``hvd.DistributedOptimizer`` issues gradients whose
hooks fire close together), under the runtime's settings (fusion and response cache off,
``pace.options.HOROVOD_RUNTIME_ENV``) and under Horovod's defaults.

    python benchmarks/bench_hvd_calls.py [--counts 1,4,16,32] [--reps 40]

Why: Horovod negotiates every tensor submitted within one cycle together and then runs their
collectives back to back, so a further call issued beside others costs less than a lone one.
The comm probe (``pace profile-comm --backend horovod``) measures the same batches
(``pace.profiler._hvd_bench.batch_times``, the slowest rank's time) and stores the further
call's cost as ``comm.batched_alpha_us``, which the simulator's cycle channel charges to every
call of a cycle but its first. This prints the batches per ``k``: the median, its spread
(IQR), and the line through the medians (``pace.profiler.comm.fit_batches``): the first call
and each further one; also under Horovod's defaults, where the response cache skips most of
the negotiation. The counts are interleaved round-robin, so a host that slows down slows every
count alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks._common import horovodrun_loopback, iqr  # noqa: E402
from pace.sim.policies import HOROVOD_FUSION_THRESHOLD_BYTES  # noqa: E402

# Horovod's defaults in 0.28 (fusion on, the simulator's threshold; response cache on), set
# explicitly so that a setting in the caller's environment does not leak into the row named
# for them.
HOROVOD_DEFAULTS_ENV = {
    "HOROVOD_FUSION_THRESHOLD": str(HOROVOD_FUSION_THRESHOLD_BYTES),
    "HOROVOD_CACHE_CAPACITY": "1024",
}
SETTINGS = tuple(HOROVOD_DEFAULTS_ENV)


def worker(counts: list[int], reps: int) -> None:
    import horovod.torch as hvd
    import torch

    from pace.profiler._hvd_bench import batch_times

    torch.set_num_threads(1)
    hvd.init()
    # The comm probe's own measurement (``pace profile-comm``): the slowest rank's time.
    times_ms = {k: [t * 1e3 for t in ts] for k, ts in batch_times(hvd, torch, counts, reps).items()}
    if hvd.rank() == 0:
        # What this rank's hvd.init() read, so the parent can check the row's label.
        print("settings", " ".join(f"{k}={os.environ.get(k, '')}" for k in sorted(SETTINGS)))
        for k in counts:
            print("times", k, " ".join(f"{t:.4f}" for t in times_ms[k]))


def main() -> int:
    from pace.cli._output import print_table
    from pace.options import HOROVOD_RUNTIME_ENV
    from pace.profiler.comm import fit_batches

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--counts", default="1,4,16,32", help="tensors issued at once, comma-separated")
    ap.add_argument("--reps", type=int, default=40, help="timed batches per count")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    try:
        counts = sorted({int(c) for c in args.counts.split(",")})
    except ValueError:
        ap.error(f"--counts: whole numbers, comma-separated (got {args.counts!r})")
    if args.worker:
        worker(counts, args.reps)
        return 0
    if len(counts) < 2 or counts[0] < 1 or args.reps < 2:
        ap.error("need two or more counts >= 1 and --reps >= 2")

    rows: list[list[object]] = []
    fits: list[list[object]] = []
    settings = {
        "fusion and cache off (the runtime's)": HOROVOD_RUNTIME_ENV,
        "Horovod's defaults (fusion, cache on)": HOROVOD_DEFAULTS_ENV,
    }
    for label, env in settings.items():
        out = horovodrun_loopback(
            __file__,
            ["--counts", ",".join(map(str, counts)), "--reps", str(args.reps)],
            env_extra=env,
        )
        medians: dict[int, float] = {}
        wanted = " ".join(f"{k}={env[k]}" for k in sorted(SETTINGS))
        if f"settings {wanted}" not in out:
            print(f"the launch under {label} did not run with {wanted}:\n{out}")
            return 1
        for line in out.splitlines():
            # horovodrun prefixes each rank's lines ("[0]<stdout>:times ...").
            _, sep, rest = line.partition("times ")
            if not sep:
                continue
            count, *values = rest.split()
            k = int(count)
            ts = [float(v) for v in values]
            medians[k] = statistics.median(ts)
            rows.append([label, k, f"{medians[k]:.3f}", f"{iqr(ts):.3f}", f"{medians[k] / k:.3f}"])
        if sorted(medians) != counts:
            print(f"the launch under {label} printed no times for every count:\n{out}")
            return 1
        fit = fit_batches({k: [m * 1e3] for k, m in medians.items()})
        first_ms, further_ms = fit.first_call_us / 1e3, fit.further_call_us / 1e3
        fits.append([label, f"{first_ms:.3f}", f"{further_ms:.3f}", f"{fit.r2:.3f}"])
    print_table(
        f"{len(counts)} batch sizes x {args.reps} batches, 2 ranks, loopback: median ms per batch",
        ["setting", "tensors at once", "median ms", "IQR ms", "ms per call"],
        rows,
    )
    print_table(
        "a line through the medians: a lone call, and each call issued beside it",
        ["setting", "first call ms", "each further call ms", "r^2"],
        fits,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
