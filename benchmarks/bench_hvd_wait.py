"""How Horovod's wait decides what a batch of calls costs on this 2-core host: 2 ranks in
``bench_netns.py``'s network namespaces (a ``tc``-limited veth pair, as root) time batches of
1, 4 and 16 tiny tensors issued at once (``pace.profiler._hvd_bench.batch_times``, under the
runtime's settings), alternating blocks that wait with Horovod's ``synchronize`` (which spins,
as ``hvd.DistributedOptimizer`` waits) and with the runtime's polling wait, which sleeps
(``pace.runtime.backends.horovod_wait``).

    python benchmarks/bench_hvd_wait.py [--rates 1gbit,500mbit] [--launches 2] [--blocks 2]

Why: the comm probe's batches (``CommModel.batched_alpha_us``) measured a lone tiny call at
6-21 ms in some launches inside the namespaces, against 1.2-1.5 ms in the same launch's
size sweep. This shows whether the spinning wait is what slows them: per block, the median
batch time per count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))  # run as a script from a checkout

COUNTS = (1, 4, 16)
REPS = 40
WAIT_TIMEOUT_S = 60.0


def worker(out: str, blocks: int) -> None:
    import horovod.torch as hvd
    import torch
    from horovod.torch import mpi_ops

    from pace.profiler._hvd_bench import batch_times
    from pace.runtime.backends import horovod_wait

    torch.set_num_threads(1)
    hvd.init()

    def poll(handle: object) -> None:
        horovod_wait(mpi_ops, handle, WAIT_TIMEOUT_S)

    rows = []
    for block in range(blocks):
        for name, wait in (("spin", None), ("poll", poll)):
            times = batch_times(hvd, torch, COUNTS, REPS, wait=wait)
            rows.append([block, name, {k: statistics.median(ts) * 1e3 for k, ts in times.items()}])
    if hvd.rank() == 0:
        Path(out).write_text(json.dumps(rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1gbit,500mbit")
    ap.add_argument("--launches", type=int, default=2, help="launches per rate")
    ap.add_argument("--blocks", type=int, default=2, help="spin/poll block pairs per launch")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args, _ = ap.parse_known_args()
    if args.worker_out:
        worker(args.worker_out, args.blocks)
        return 0
    if args.launches < 1 or args.blocks < 1:
        ap.error("--launches and --blocks must be >= 1")
    import bench_netns

    from pace.cli._output import print_table

    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp, bench_netns.throttled_link() as link:
        for rate in args.rates.split(","):
            bench_netns.set_rate(link, rate)
            for launch in range(args.launches):
                out = str(Path(tmp) / f"{rate}-{launch}.json")
                argv = ["--worker-out", out, "--blocks", str(args.blocks)]
                env = bench_netns.pace_horovod_env()
                bench_netns.launch(link, "horovod", argv, env, script=__file__)
                for block, wait, medians in json.loads(Path(out).read_text()):
                    ms = [f"{medians[str(k)]:.2f}" for k in COUNTS]
                    rows.append([rate, launch, block, wait, *ms])
    print_table(
        f"median ms per batch of tiny tensors issued at once ({REPS} batches per count), "
        "2 ranks in network namespaces, fusion and cache off",
        ["rate", "launch", "block", "wait", *(f"{k} at once" for k in COUNTS)],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
