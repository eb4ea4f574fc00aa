"""Does the sync mode slow the forward that follows it? 2 Horovod ranks, CPU, gloo, where the
forward's time goes.

    python benchmarks/bench_sync_forward.py [--rate 1gbit] [--blocks 6 --steps-per-block 5]

On the throttled link (``bench_netns.py``) rank 0's forward in the sync mode with Horovod took
0-33 ms more than ``local``'s, although every unit is done before the forward starts
(docs/results.md). This runs the same model (``pace:vgg-cifar``, batch 10, one compute thread)
with the same Horovod settings (fusion and response cache off; ``--horovod-env K=V,...`` adds
settings) on loopback, or with ``--rate`` (as root) on ``bench_netns.py``'s two namespaces and
``tc``-limited veth pair, and times each phase per iteration. Per forward it also reads, from
the kernel's per-thread scheduler statistics (``/proc/self/task/*/schedstat``), the training
thread's CPU time and its time waiting for a core (run-queue wait), the CPU time of the
process's other threads (Horovod's background loop, gloo's, the runtime's), and from
``/proc/stat`` how busy the host's cores were:

* ``local``: no communication;
* ``vanilla-nofusion``: ``hvd.DistributedOptimizer``;
* ``pace-sync``: ``pace.runtime.wrap(..., sync=True)`` with a hand-made sync schedule of 4 units
  of about equal size, in back-propagation order.

Variants alternate block by block in one launch. Prints each rank's medians (times) and means
(CPU accounting, whose clock ticks are coarse).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks._common import env_pairs, horovodrun_loopback, host_busy_ms  # noqa: E402

KINDS = ("local", "vanilla-nofusion", "pace-sync")
# Per iteration: forward s, forward minor faults, backward s, step s, then over the forward:
# the training thread's CPU ms and run-queue wait ms, the other threads' CPU ms, the host's
# busy core-ms.
FIELDS = ("fwd", "faults", "bwd", "step", "main_cpu", "main_wait", "others_cpu", "host_busy")
FIELDS += ("unsent_kib",)  # at the forward's start


def _threads_ns() -> dict[int, tuple[str, int, int, int]]:
    """tid -> (name, CPU ns, run-queue wait ns, times put on a core) for each thread of this
    process (schedstat)."""
    out: dict[int, tuple[str, int, int, int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run_ns, wait_ns, slices = f.read().split()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended between listdir and open
            continue
        out[int(tid)] = (name, int(run_ns), int(wait_ns), int(slices))
    return out


def _unsent_kib() -> float:
    """KiB written to this network namespace's TCP sockets and not yet acknowledged by the peer
    (the tx_queue column of ``/proc/net/tcp``): data still on its way through the link."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.readlines()[1:]
        except OSError:
            continue
        total += sum(int(row.split()[4].split(":")[0], 16) for row in rows)
    return total / 1024


def _sync_schedule(model: Any) -> Any:
    from pace.ir import CommModel, Schedule, Slice, Unit

    params = list(reversed(list(model.named_parameters())))
    sizes = [p.numel() * p.element_size() for _, p in params]
    quarter = sum(sizes) / 4
    units: list[Unit] = []
    group: list[Slice] = []
    filled = 0
    for (name, _), size in zip(params, sizes, strict=True):
        group.append(Slice(tensor=name, offset_bytes=0, size_bytes=size))
        filled += size
        if filled >= quarter:
            units.append(Unit(priority=float(len(units)), slices=tuple(group)))
            group, filled = [], 0
    if group:
        units.append(Unit(priority=float(len(units)), slices=tuple(group)))
    return Schedule(
        trace_digest="sha256:bench",
        cost_model=CommModel(workers=2, alpha_us=0.0, beta_us_per_byte=0.0),
        units=tuple(units),
        predicted_iteration_us=0.0,
        mode="sync",
    )


def worker(args: argparse.Namespace) -> None:
    # What pace runs with (bench_netns sets the same for every variant but vanilla).
    os.environ["HOROVOD_FUSION_THRESHOLD"] = "0"
    os.environ["HOROVOD_CACHE_CAPACITY"] = "0"
    import horovod.torch as hvd
    import torch
    from torch.nn import functional

    import pace.runtime
    from pace.profiler.workloads import vgg_cifar

    torch.set_num_threads(1)
    before_init = set(_threads_ns())
    hvd.init()
    # Name the threads by who started them (they are all called "python"): Horovod's
    # background loop and gloo's at init, the runtime's when it wraps, torch's at first use.
    owner = {t: f"horovod{i}" for i, t in enumerate(sorted(set(_threads_ns()) - before_init))}
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(args.batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)

    def make(kind: str) -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = vgg_cifar(10)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if kind == "local":
            return model, opt
        if kind == "vanilla-nofusion":
            return model, hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return model, pace.runtime.wrap(
                opt, model, _sync_schedule(model), backend="horovod", sync=True
            )

    runs: dict[str, tuple[Any, Any]] = {}
    for k in KINDS:
        known = set(_threads_ns())
        runs[k] = make(k)
        owner.update(dict.fromkeys(set(_threads_ns()) - known - set(owner), k))
    samples: dict[str, list[tuple[float, ...]]] = {k: [] for k in KINDS}
    # Per variant and thread owner: CPU ms and times put on a core, over all kept forwards.
    others_by_name: dict[str, defaultdict[str, list[float]]] = {
        k: defaultdict(lambda: [0.0, 0.0]) for k in KINDS
    }
    main_tid = threading.get_native_id()

    def block(kind: str, steps: int, keep: bool) -> None:
        model, opt = runs[kind]
        for _ in range(steps):
            opt.zero_grad()
            unsent = _unsent_kib()
            threads0, host0 = _threads_ns(), host_busy_ms()
            faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            loss = functional.cross_entropy(model(x), y)
            t1 = time.perf_counter()
            faults1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            threads1, host1 = _threads_ns(), host_busy_ms()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            if not keep:
                continue
            others_ms = 0.0
            for tid, (_, run1, _, slices1) in threads1.items():
                _, run0, _, slices0 = threads0.get(tid, ("", 0, 0, 0))
                if tid != main_tid:
                    others_ms += (run1 - run0) / 1e6
                    acc = others_by_name[kind][owner.get(tid, "torch")]
                    acc[0] += (run1 - run0) / 1e6
                    acc[1] += slices1 - slices0
            _, main_run1, main_wait1, _ = threads1[main_tid]
            _, main_run0, main_wait0, _ = threads0[main_tid]
            samples[kind].append(
                (
                    t1 - t0,
                    float(faults1 - faults0),
                    t2 - t1,
                    t3 - t2,
                    (main_run1 - main_run0) / 1e6,
                    (main_wait1 - main_wait0) / 1e6,
                    others_ms,
                    host1 - host0,
                    unsent,
                )
            )
        if kind != "local":
            opt.synchronize()

    for k in KINDS:
        block(k, args.steps_per_block, keep=False)  # warm-up
    for b in range(args.blocks):
        for k in KINDS if b % 2 == 0 else KINDS[::-1]:
            block(k, args.steps_per_block, keep=True)
    for _, opt in runs.values():
        if hasattr(opt, "close"):
            opt.close()
    result = {}
    for k, v in samples.items():
        times = [statistics.median(s[i] for s in v) for i in range(4)]
        cpu = [statistics.fmean(s[i] for s in v) for i in range(4, len(FIELDS))]
        busiest = sorted(others_by_name[k].items(), key=lambda kv: -kv[1][0])[:3]
        top = [(n, ms / len(v), runs / len(v)) for n, (ms, runs) in busiest]
        result[k] = {"values": times + cpu, "top": top}
    Path(args.out, f"rank{hvd.rank()}.json").write_text(json.dumps(result))


def _launch(args: argparse.Namespace, out: Path) -> None:
    worker_args = ["--batch", str(args.batch), "--blocks", str(args.blocks)]
    worker_args += ["--steps-per-block", str(args.steps_per_block), "--out", str(out)]
    extra = env_pairs(args.horovod_env)
    if not args.rate:
        os.environ.update(extra)
        horovodrun_loopback(__file__, worker_args)
        return
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        raise SystemExit("bench_sync_forward: --rate needs root and iproute2 (ip, tc)")
    from benchmarks import bench_netns as netns

    with netns.throttled_link() as link:
        netns.set_rate(link, args.rate)
        netns.launch(link, "horovod", ["--worker", *worker_args], extra, script=__file__)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--steps-per-block", type=int, default=5)
    ap.add_argument("--rate", help="tc rate of bench_netns.py's link (as root); default loopback")
    ap.add_argument("--horovod-env", default="", metavar="K=V,...", help="more Horovod settings")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    tmp = Path(tempfile.mkdtemp(prefix="pace-syncfwd-"))
    try:
        _launch(args, tmp)
        per_rank = {r: json.loads((tmp / f"rank{r}.json").read_text()) for r in (0, 1)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    where = f"a {args.rate} tc-limited veth pair" if args.rate else "loopback"
    print(
        f"pace:vgg-cifar, batch {args.batch}/rank, 2 ranks (gloo, {where}), Horovod fusion and "
        f"response cache off{', ' + args.horovod_env if args.horovod_env else ''}; median "
        f"(times) and mean (CPU) over {args.blocks} blocks x {args.steps_per_block} iterations; "
        "forward's CPU: the training thread's own, its wait for a core, the other threads' "
        "of its process, the host's busy core-ms (2 cores); unsent: KiB in its TCP send queues "
        "as the forward starts"
    )
    print(
        f"{'rank':>4} {'variant':<17} {'fwd ms':>7} {'vs local':>8} {'faults':>6} "
        f"{'main cpu':>8} {'waited':>7} {'others':>7} {'host':>6} {'unsent':>7} {'bwd ms':>7} "
        f"{'step ms':>7}"
        "  others by who started them (CPU ms/times on a core, per forward)"
    )
    for rank in sorted(per_rank):
        res = per_rank[rank]
        base = res["local"]["values"][0]
        for k in KINDS:
            fwd, faults, bwd, step, main_cpu, waited, others, host, unsent = res[k]["values"]
            top = ", ".join(f"{n} {ms:.1f}/{runs:.0f}" for n, ms, runs in res[k]["top"])
            print(
                f"{rank:>4} {k:<17} {fwd * 1e3:7.1f} {(fwd - base) * 1e3:+8.1f} {faults:6.0f} "
                f"{main_cpu:8.1f} {waited:7.1f} {others:7.1f} {host:6.0f} {unsent:7.0f} "
                f"{bwd * 1e3:7.1f} {step * 1e3:7.1f}  {top}"
            )


if __name__ == "__main__":
    main()
