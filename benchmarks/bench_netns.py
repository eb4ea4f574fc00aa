"""Measured speed-up on a throttled link: two network namespaces, one training process in each.

    python benchmarks/bench_netns.py [--rates 500mbit,1gbit,2gbit] [--backends horovod,torch]

(as root: `ip netns` and `tc` need it; add --markdown for the table of docs/results.md)

The script makes two network namespaces joined by a veth pair, limits each direction of the
pair with a ``tc`` token-bucket filter, and removes all of it on exit (also on Ctrl-C or an
error). Traffic flows only between the two namespaces it made. One rank of a 2-rank data-parallel
job runs in each namespace, on the CPU, one compute thread each, training ``pace:vgg-cifar``
(VGG-16 for 32x32 images: 56 MiB of gradients, most of them in the late layers, which backward
produces first and forward needs last: the case for scheduling).

Per rate, per backend:

1. **comm fit**: all-reduce times over the throttled link, 2 ranks, fitted to ``alpha + beta *
   bytes`` (the same statistic as ``pace profile-comm``); then the interference probe
   (``pace.profiler.interference``: compute lost beside back-to-back calls of one size).
2. **calibrate** (``--handoff``, the default): a short launch trains the schedule the probe's
   term compiles to, the online mode, the sync mode, vanilla and ``local``. The runtime's
   units' channel time and the compute lost beside them are fitted to it (with torch, DDP's
   period too), with Horovod the per-byte cost of vanilla's fused calls, and the sync mode's
   and DDP's optimizer step is measured, with Horovod also how much longer than `local`'s the
   sync mode's forward took (``calibrate_handoff``, ``AsRun``). Its ``local`` is
   the compute the compiler is given: the profile (one process, this CPU, one thread, taken
   once before any of this) scaled to what the job measured (two ranks on the cores, the
   backend idling), as a profile taken inside the job would be; in the job's shape too
   (``reshaped``): the backward warped to when `local` marked each gradient on the slower
   rank, the forward and the step scaled to the rest.
3. **compile**: that trace with the fitted cost model and term, through
   ``pace.compiler.compile_trace`` (the default pipeline).
4. **predict**, before the timed launch: the simulator's replay of the trace under the policy
   that describes each variant, plus the optimizer step where the training thread runs it
   (the replay window holds forward and backward only; the runtime's overlapped modes update
   in the background as units complete); the compute is the calibration launch's
   (``--no-handoff``: the profile's).
5. **train**: the variants, in blocks alternating within one launch so slow drift of the shared
   machine hits all alike; per-iteration periods (start of one step to the start of the next;
   an in-step `local`'s: its iteration's compute, the barrier before it not counted), median
   over all blocks. A block's first iteration is not counted (``LEAD_IN``): it starts
   with nothing in flight, where in the overlapped modes every later one waits for the last
   one's reductions. Horovod's vanilla run uses Horovod's defaults (tensor fusion,
   response cache); every other variant runs with fusion and cache off, as the pace runtime
   requires. Both are in the same launch: the ranks re-initialise Horovod (``hvd.shutdown()``,
   then ``hvd.init()`` under the other settings) where the blocks switch between the two; the
   variants under Horovod's defaults run first in each pass (``by_settings``), so a launch
   switches once per pass. A Horovod launch whose ranks die is run once more
   (``run_attempts``; Horovod 0.28 has died re-initialising).

Variants: ``vanilla`` (``hvd.DistributedOptimizer`` with Horovod's defaults; for torch: DDP),
``vanilla-nofusion`` (Horovod only: the same, fusion and cache off), ``online`` (the runtime's
ByteScheduler mode: layer priority, 4 MiB partitions, 16 MiB credit), ``pace`` (the runtime
replaying the compiled schedule), ``pace-sync`` (the runtime's synchronous mode,
``wrap(..., sync=True)`` with a schedule compiled by ``--mode sync``: ``backward()`` returns
with every gradient reduced, as DDP's, the mode gradient clipping and ``GradScaler`` need),
``local`` (no communication: what compute alone costs while the other rank also runs, the
ranks in step as every data-parallel job's are: each iteration starts once both ranks ended the
last (a one-float barrier, not timed: ``step_barrier``); per iteration the slower rank's
compute, which a job that communicates waits for: ``slower_rank``), ``local-free`` (the same
with the ranks running free, each at its own pace: a diagnostic of what computing in step
costs on this host, ``LOCAL_FREE``; not predicted).
With ``--compare-path`` (Horovod), ``pace@path``: pace's schedule marked for Horovod's own path,
what ``pace.runtime.wrap`` trains where the compiler predicts that path faster than the units
(``hvd.DistributedOptimizer`` under Horovod's defaults, its reductions waited for by the
runtime's polling wait instead of Horovod's spinning one); not predicted apart from vanilla.
With ``--compare-joins``, ``pace-nojoin``: pace's schedule compiled with no units joined. With
``--compare-hedge``, ``pace-nohedge``: the schedule the calibrated model alone compiles to (no
hedge over the probe's compute loss or a faster compute): the pair says whether the hedge's
choice is the faster one on the link.

Beside each prediction: ``calibrated`` (the same replay from the timed launch's own ``local``)
and ``repeat`` (the calibration launch's own measurement of the same program: how far a
measurement moves between two launches on this host, the floor under any prediction's error).
Where the compiler replaced the calibration launch's schedules, the timed launch trains those
too (``pace@cal``, ``pace-sync@cal``), so the compiled modes' programs have a repeat as well; a
mode compiled to Horovod's own path repeats the calibration launch's ``vanilla`` (its program).
From these, each miss gets the first measured cause that accounts for it (``error_cause``: within
5%, the run's noise, compute drift, launch drift), or is left to the model, row by row.

The runtime's units are timed on every rank; a unit's channel time is from when the last rank
could start it to when the last rank saw it done (``merged_units``). With the iterations' marks
(when each rank's forward ended) they also say where the overlapped modes' channel idled in an
iteration, beside the replay's (``measured_idle``, ``replay_idle``): after the last unit of the
iteration before (the forward that waited for it), before the first unit (the backward until
it is ready on every rank) and between units. The period is the channel's busy time plus these,
so a period's miss splits into the channel's and these three. With every rank's gradient times
the head splits further, on the rank that issued the first unit last: its backward up to the
unit's last gradient, the runtime's dispatch (and packing), and the ranks' skew.

Each variant's host CPU per iteration is printed split by thread (``read_threads``): the
training thread, pace's own threads, the backend's (gloo's or Horovod's C++ threads) and the
kernel's remainder, summed over the ranks.

Where the compiler replaced a calibration launch's schedule, a table sets each new schedule
beside the one it replaced, trained again in the same launch: the gain the model that chose it
replayed, and the gain measured (``replacement_gains``). The compiler picks what its model
replays fastest, so where the model errs it is biased towards its pick; this measures how much.

The goal table judges each rate and backend by the goal this benchmark answers: ``pace`` never
slower than vanilla beyond the spread (``against_vanilla``: the medians' 95% CIs apart), and
1.15x over vanilla wherever vanilla's communication is exposed (its period over its ``local``'s)
by 15% or more (``goal_verdict``; ``out of reach`` where no schedule could gain that much).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import dataclasses
import functools
import itertools
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks._common import (  # noqa: E402
    THREAD_CLASSES,
    compute_only_us,
    env_pairs,
    host_busy_ms,
    iqr,
    thread_cpu_ms,
)

if TYPE_CHECKING:
    from pace.compiler import CompileResult

MODEL = "pace:vgg-cifar"
NUM_CLASSES = 10
LR = 0.01


def pace_horovod_env() -> dict[str, str]:
    """The Horovod settings the pace runtime uses (read once by hvd.init()), plus any
    ``--horovod-env`` overrides of this run."""
    from pace.runtime.backends import HOROVOD_ENV

    return {**HOROVOD_ENV, **_HOROVOD_OVERRIDES}


_HOROVOD_OVERRIDES: dict[str, str] = {}
# Horovod settings under which re-initialising Horovod (``_reinit_horovod``, where vanilla's
# blocks and the others' alternate in a training launch) can crash: with HOROVOD_CYCLE_TIME set
# both ranks died of SIGSEGV in hvd.init() after hvd.shutdown() (2026-11-24, at 1 and at 5 ms;
# never with it unset), where earlier runs with it set had finished (docs/runtime.md).
REINIT_CRASHES = frozenset({"HOROVOD_CYCLE_TIME"})
REINIT_WARNING = (
    f"warning: --horovod-env sets {', '.join(sorted(REINIT_CRASHES))}: Horovod 0.28 can crash "
    "(SIGSEGV) re-initialising under it, which the training launches do; if a launch fails "
    "with signal SIGSEGV, measure the setting with benchmarks/bench_sync_forward.py instead"
)
# `pace@path` (--compare-path): pace's schedule marked for Horovod's own path, so pace.runtime.wrap
# trains it as the compiler's framework choice does (hvd.DistributedOptimizer, the runtime's
# wait), beside vanilla's own loop.
PATH_VARIANT = "pace@path"
# `pace-nojoin` (--compare-joins): pace's schedule compiled with the order search's moves only,
# no units joined (``compile_trace(join_units=False)``), beside `pace` in the same launch: what
# joining units gives on the link, measured, not only replayed.
NOJOIN_VARIANT = "pace-nojoin"
# `pace-nohedge` (--compare-hedge): the schedule the calibrated model alone compiles to
# (``compile_trace`` without ``hedge`` or ``compute_hedge``), beside `pace` (hedged over the
# probe's compute loss and a faster compute) in the same launch: what hedging gives on the
# link, measured. Often the same program; where not, the model usually replays the nominal
# one faster (the hedge trades time under it for less regret under the others), though a
# hedge's candidate can also replay faster under it (the pipeline's search is not exhaustive).
NOHEDGE_VARIANT = "pace-nohedge"
# The Horovod variants that run under Horovod's own defaults (fusion, cache), not the runtime's.
DEFAULT_SETTINGS_VARIANTS = frozenset({"vanilla", "local@vanilla", PATH_VARIANT})
# The variants that pace.runtime drives (the rest: vanilla DDP or Horovod, and `local`s).
# `pace@cal` and `pace-sync@cal`: the calibration launch's schedules, trained again in the
# timed launch where the compiler then compiled to other units (``again_schedules``).
AGAIN = "@cal"
COMPILED_MODES = ("pace", "pace-sync")
RUNTIME_VARIANTS = frozenset(
    {
        "online",
        "pace",
        "pace-serial",
        "pace-sync",
        NOJOIN_VARIANT,
        NOHEDGE_VARIANT,
        *(f"{v}{AGAIN}" for v in COMPILED_MODES),
    }
)
SYNC_VARIANTS = frozenset({"pace-sync", f"pace-sync{AGAIN}"})
# The runtime's overlapped modes apply each unit's update on the runtime's completion thread
# as the unit completes, while the next forward waits for later units: their step() returns in
# 0.1 ms (the workers' phase times), so the profiled step is not added to their period. DDP,
# Horovod and the sync mode run the optimizer's step on the training thread after backward.
STEP_IN_BACKGROUND = RUNTIME_VARIANTS - SYNC_VARIANTS
# Iterations a timed block runs before its first counted period starts. A block begins with
# nothing in flight (the block before drained), so its first iteration's forward waits for no
# reduction: in the overlapped modes (pace, online) that iteration is the steady state's minus
# the wait for the last iteration's units, which no training loop but the first iteration sees.
# Counted, it was one period in `steps` and pulled their medians down (`lead_in_report`).
LEAD_IN = 1
# `local` computes with its ranks in step, `local-free` with them free (a diagnostic). Two
# processes on this host's two cores, no communication, ran VGG-cifar's iteration 1.19x slower
# when each iteration started on both at once (a barrier, as a data-parallel job's collectives
# impose) than free-running, which ran as fast as one process alone (2026-11-28, quiet host:
# `python benchmarks/bench_in_step.py`): both ranks in the same layers at once contend for the
# shared cache and memory more than two ranks in different layers. Inside the full run's
# launches (Horovod's loop and the network's kernel work beside, a loaded host) `local` in step
# measured -5.9% to +8.1% against `local-free`, within their spread (docs/results.md). Every
# communicating variant runs in step, so the compute the model is given and the `local` that
# exposure is judged by are in step.
LOCAL_FREE = "local-free"
BARRIER_TIMEOUT_S = 300.0


def iterations_per_block(steps: int) -> int:
    """The iterations a block runs: the lead-in, the ``steps`` counted, and the one whose start
    ends the last counted period (its units are drained, not counted)."""
    return LEAD_IN + steps + 1


LAUNCH_TIMEOUT_S = 1800.0
# A Horovod launch whose ranks fail is run this many times in all (``launch``).
HOROVOD_ATTEMPTS = 2
NETNS_ETC = Path("/etc/netns")  # per-namespace /etc overrides of `ip netns exec`


# --------------------------------------------------------------------------- the link


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """Two namespaces joined by a veth pair: rank r runs in ``ns[r]`` at ``ip[r]`` on ``dev[r]``."""

    ns: tuple[str, str]
    dev: tuple[str, str]
    ip: tuple[str, str]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def throttled_link() -> Iterator[Link]:
    """Create the namespaces and veth pair; always delete them (which also drops the tc rules)."""
    tag = f"{os.getpid() % 100000}"
    subnet = 16 + os.getpid() % 200  # 10.231.<subnet>.0/24: unlikely to meet anything else
    link = Link(
        ns=(f"pace-a-{tag}", f"pace-b-{tag}"),
        dev=(f"pa{tag}", f"pb{tag}"),
        ip=(f"10.231.{subnet}.1", f"10.231.{subnet}.2"),
    )
    made: list[str] = []
    etc_existed = NETNS_ETC.exists()
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        for r, ns in enumerate(link.ns):
            _ip("netns", "add", ns)
            made.append(ns)
            # `ip netns exec` bind-mounts /etc/netns/NS/hosts over /etc/hosts. Horovod 0.28's
            # process-set contexts create their gloo device without HOROVOD_GLOO_IFACE, so gloo
            # binds to whatever this host's name resolves to: make that the namespace's address.
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            hostname = socket.gethostname()
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{link.ip[r]} {hostname}\n")
        _ip("link", "add", link.dev[0], "type", "veth", "peer", "name", link.dev[1])
        for r in (0, 1):
            _ip("link", "set", link.dev[r], "netns", link.ns[r])
            _ip("-n", link.ns[r], "addr", "add", f"{link.ip[r]}/24", "dev", link.dev[r])
            _ip("-n", link.ns[r], "link", "set", link.dev[r], "up")
            _ip("-n", link.ns[r], "link", "set", "lo", "up")
        yield link
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth, hence the pair
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        if not etc_existed:
            with contextlib.suppress(OSError):
                NETNS_ETC.rmdir()
        signal.signal(signal.SIGTERM, old_term)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def set_rate(link: Link, rate: str) -> None:
    """Limit each direction of the pair to ``rate`` (tc syntax: 1gbit, 500mbit, ...)."""
    for r in (0, 1):
        # A token bucket on each egress. The burst must hold a whole GSO super-packet (64 KiB);
        # 1 Mbit keeps the shaping smooth at the time scale of one all-reduce (milliseconds).
        cmd = ["tc", "-n", link.ns[r], "qdisc", "replace", "dev", link.dev[r], "root", "tbf"]
        cmd += ["rate", rate, "burst", "1mbit", "latency", "50ms"]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


# --------------------------------------------------------------------------- launching ranks


def _rank_cmd(link: Link, rank: int, argv: Sequence[str], script: str = __file__) -> list[str]:
    return ["ip", "netns", "exec", link.ns[rank], sys.executable, script, *argv]


PIN_ENV = "PACE_BENCH_PIN"  # set by --pin: each rank's process on a core of its own


def _base_env() -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )


def pin_rank() -> int | None:
    """Under ``--pin``, put this rank's process (every thread it starts from now on: the
    training thread, the runtime's, Horovod's and gloo's) on core ``rank % cores``, as if each
    rank had a machine of its own; the core, or None when not pinned. Called before anything
    starts a thread."""
    if os.environ.get(PIN_ENV) != "1":
        return None
    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("RANK", "0")))
    cores = sorted(os.sched_getaffinity(0))
    core = cores[rank % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


def launch(
    link: Link,
    backend: str,
    argv: Sequence[str],
    extra_env: dict[str, str] | None = None,
    *,
    script: str = __file__,
) -> None:
    """Run ``script argv`` (this script's worker role by default) as 2 ranks, one per
    namespace."""
    env = _base_env() | (extra_env or {})
    if backend == "horovod":
        # Horovod's gloo rendezvous server must be reachable by both ranks: a small driver
        # in rank 0's namespace runs it (what horovodrun does, without ssh).
        cmd = ["ip", "netns", "exec", link.ns[0], sys.executable, __file__, "--role", "hvd-driver"]
        cmd += ["--link", json.dumps([link.ns, link.dev, link.ip]), "--driver-script", script]
        cmd += ["--", *argv]
        # Horovod 0.28 re-initialising in one process (the training launches' switch of
        # settings) has died in gloo's connect (Connection refused, then SIGABRT on both ranks,
        # 2026-11-27); nothing of such a launch is kept (the ranks write their files at the
        # end), so it runs again from the start.
        run_attempts(lambda: [subprocess.Popen(cmd, env=env)], HOROVOD_ATTEMPTS)
        return
    procs = []
    for r in (0, 1):
        renv = env | {
            "MASTER_ADDR": link.ip[0],
            "MASTER_PORT": "29512",
            "RANK": str(r),
            "WORLD_SIZE": "2",
            "GLOO_SOCKET_IFNAME": link.dev[r],
        }
        procs.append(subprocess.Popen(_rank_cmd(link, r, argv, script), env=renv))
    _wait_all(procs)


def run_attempts(start: Callable[[], list[subprocess.Popen[bytes]]], attempts: int) -> None:
    """Start the processes and wait for them (``_wait_all``), up to ``attempts`` times in all
    while they fail (``LaunchFailedError``; a time-out is not run again), saying each failure."""
    for attempt in range(1, attempts + 1):
        try:
            _wait_all(start())
            return
        except LaunchFailedError as crash:
            if attempt == attempts:
                raise
            _say(f"  the launch failed ({crash}); running it again ({attempt + 1} of {attempts})")


def _wait_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Wait for every process; if one fails or the time runs out, stop the others too."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"ranks did not finish in {LAUNCH_TIMEOUT_S:.0f} s")
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)
                if p.poll() is None:
                    p.kill()
    codes = [p.returncode for p in procs]
    if any(c != 0 for c in codes):
        signals = sorted({signal.Signals(-c).name for c in codes if c is not None and c < 0})
        killed = f", killed by {', '.join(signals)}" if signals else ""
        raise LaunchFailedError(f"a rank failed (exit codes {codes}{killed}); see its output above")


class LaunchFailedError(RuntimeError):
    """A launch's process exited non-zero or by a signal (not a time-out: a hang is not run
    again)."""


def hvd_driver(link_json: str, argv: Sequence[str], script: str = __file__) -> None:
    """Runs in rank 0's namespace: Horovod's rendezvous server, then both ranks (``script
    argv``)."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
    from horovod.runner.http.http_server import RendezvousServer

    ns, dev, ip = (tuple(x) for x in json.loads(link_json))
    link = Link(ns=(ns[0], ns[1]), dev=(dev[0], dev[1]), ip=(ip[0], ip[1]))
    plan = get_host_assignments(parse_hosts(f"{link.ip[0]}:1,{link.ip[1]}:1"), 2)
    server = RendezvousServer(False)
    port = server.start()
    server.init(plan)
    procs = []
    for slot in plan:
        r = int(slot.rank)
        env = dict(os.environ)
        env.update({k: str(v) for k, v in create_run_env_vars(link.ip[0], [dev[r]], port).items()})
        env.update({k: str(v) for k, v in create_slot_env_vars(slot).items()})
        cmd = [sys.executable, script, *argv] if r == 0 else _rank_cmd(link, r, argv, script)
        procs.append(subprocess.Popen(cmd, env=env))
    try:
        _wait_all(procs)
    finally:
        server.stop()


# --------------------------------------------------------------------------- the ranks' work


def _init_backend(backend: str) -> tuple[int, int]:
    if backend == "horovod":
        import horovod.torch as hvd

        hvd.init()
        return int(hvd.rank()), int(hvd.size())
    import torch.distributed as dist

    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def _close_backend(backend: str) -> None:
    """Tear a torch process group down before the interpreter exits: left to exit-time
    destructors, gloo's threads can abort the process ("terminate called without an active
    exception") after its work is done, failing the launch."""
    if backend == "horovod":
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def worker_comm(args: argparse.Namespace) -> None:
    """All-reduce times over the link: per size, median over reps of the slowest rank."""
    import torch

    torch.set_num_threads(1)
    rank, _ = _init_backend(args.backend)
    if args.backend == "horovod":
        import horovod.torch as hvd

        def allreduce(buf: Any, tag: str) -> None:
            hvd.allreduce_(buf, op=hvd.Sum, name=tag)

        def slowest(x: float, tag: str) -> float:
            t = hvd.allgather(torch.tensor([x], dtype=torch.float64), name=tag)
            return float(t.max())
    else:
        import torch.distributed as dist

        def allreduce(buf: Any, tag: str) -> None:
            dist.all_reduce(buf)

        def slowest(x: float, tag: str) -> float:
            t = torch.tensor([x], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return float(t)

    sizes = [int(s) for s in args.sizes.split(",")]
    bufs = {size: torch.ones(max(1, size // 4)) for size in sizes}
    for size in sizes * 2:  # warm up every size first: connections, buffers, TCP windows
        allreduce(bufs[size], f"ar.{size}")
    times: dict[int, list[float]] = {size: [] for size in sizes}
    cpu: dict[int, list[float]] = {size: [] for size in sizes}
    for rep in range(args.comm_reps):
        # Sizes interleaved within each repetition, so slow drift of the machine hits all.
        for size in sizes:
            allreduce(torch.zeros(1), f"bar.{size}.{rep}")  # start together
            t0, c0 = time.perf_counter(), time.process_time()
            allreduce(bufs[size], f"ar.{size}")
            # CPU of this process (all its threads, user + kernel) while the bytes moved:
            # on a machine whose cores also compute, what an overlapped all-reduce takes from it.
            cpu[size].append(time.process_time() - c0)
            times[size].append(slowest(time.perf_counter() - t0, f"t.{size}.{rep}"))
    samples = [
        [bufs[s].numel() * 4, statistics.median(times[s]) * 1e6, statistics.median(cpu[s]) * 1e6]
        for s in sizes
    ]
    if rank == 0:
        Path(args.out).write_text(json.dumps(samples))
    if args.backend == "horovod":
        # The further call's cost (``CommModel.batched_alpha_us``), as ``pace profile-comm``
        # measures it: the unfused baseline's tensors are negotiated a cycle's worth at once.
        from pace.profiler._hvd_bench import write_batches

        write_batches(hvd, torch, f"{args.out}.batches")


def worker_interference(args: argparse.Namespace) -> None:
    """Compute lost to all-reduces beside it, every rank at once (pace.profiler.interference);
    each rank writes its own measurement to ``--out.RANK``."""
    import torch
    from torch.nn import functional

    from pace.profiler.interference import measure_on_rank, probe_us
    from pace.profiler.workloads import vgg_cifar

    torch.set_num_threads(1)
    # The probe is the job's own computation: one forward and backward of the model, no
    # communication (its cores, caches and memory traffic are what the all-reduces meet).
    model = vgg_cifar(NUM_CLASSES)
    x = torch.randn(args.batch, 3, 32, 32)
    y = torch.randint(0, NUM_CLASSES, (args.batch,))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]

    plain_us = probe_us(step, reps=PROBE_REPS)  # before the backend (and its threads) start
    rank, _ = _init_backend(args.backend)
    if args.backend == "horovod":
        import horovod.torch as hvd

        def allreduce(buf: Any) -> None:
            hvd.allreduce_(buf, op=hvd.Sum, name=f"interference.{buf.numel()}")
    else:
        import torch.distributed as dist

        def allreduce(buf: Any) -> None:
            dist.all_reduce(buf)

    sizes = [int(x) for x in args.sizes.split(",")]
    call_us = [float(x) for x in args.calls.split(",")]
    measure_on_rank(
        allreduce,
        sizes_bytes=sizes,
        call_us=call_us,
        plain_us=plain_us,
        out=args.out,
        rank=rank,
        window_us=INTERFERENCE_WINDOW_US,
        probe=step,
        idle_reps=IDLE_REPS,
    )


class UnitLog:
    """A runtime monitor that keeps, per unit, its bytes, its channel time on this rank (us)
    and when this rank saw it done (``time.perf_counter()``, s: one clock for every rank of
    the host, so the ranks' logs line up; ``merged_units``). The worker adds, per iteration of
    the same blocks, when its forward started and ended and its backward ended (``marks``, the
    same clock): where the channel idled between units (``measured_idle``)."""

    def __init__(self) -> None:
        self.done: list[tuple[int, float, float]] = []
        self.marks: list[tuple[float, float, float]] = []
        self.grads: list[float] = []  # when each gradient was marked ready (s): ``head_split``
        self.timing = True  # off during warm-up: only the measured blocks' units count

    def on_grad_ready(self, tensor: int, t_us: float) -> None:
        if self.timing:
            self.grads.append(t_us / 1e6)

    def on_unit_done(self, unit_index: int, size_bytes: int, duration_us: float) -> None:
        if self.timing:
            self.done.append((size_bytes, duration_us, time.perf_counter()))


def in_step(kind: str) -> bool:
    """Does ``kind`` start each iteration on every rank at once by a barrier of its own
    (`local`, `local@vanilla`; not ``LOCAL_FREE``)? The variants that communicate are in step
    through their collectives."""
    return kind.startswith("local") and kind != LOCAL_FREE


def step_barrier(backend: str) -> None:
    """Hold this rank until every rank has reached it: one all-reduce of one float
    (Horovod's waited for by the runtime's polling wait, which gives the core away, not by
    ``synchronize()``'s spin, which would take it from the rank still computing)."""
    import torch

    if backend == "horovod":
        from horovod.torch import mpi_ops

        from pace.runtime.backends import horovod_wait

        flag = torch.zeros(1)
        handle = mpi_ops.allreduce_async_(flag, name="local.step", op=mpi_ops.Sum)
        horovod_wait(mpi_ops, handle, BARRIER_TIMEOUT_S)
        return
    import torch.distributed as dist

    dist.barrier()


def worker_train(args: argparse.Namespace) -> None:
    """Train every variant from the same weights, alternating blocks; rank 0 writes periods."""
    import warnings

    import torch
    from torch.nn import functional

    import pace.runtime
    from pace.profiler.workloads import vgg_cifar

    torch.set_num_threads(1)
    rank, _ = _init_backend(args.backend)
    # The Horovod settings each block ran under (what hvd.init() read), for the report.
    settings_seen: dict[str, dict[str, str | None]] = {}
    current = _horovod_settings() if args.backend == "horovod" else {}
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args.batch, 3, 32, 32, generator=g)
    y = torch.randint(0, NUM_CLASSES, (args.batch,), generator=g)

    from pace.io import load_schedule

    schedule_of = {
        "pace": args.schedule,
        "pace-serial": args.schedule,
        "pace-sync": args.sync_schedule,
        f"pace{AGAIN}": args.again_schedule,
        PATH_VARIANT: args.path_schedule,
        NOJOIN_VARIANT: args.nojoin_schedule,
        NOHEDGE_VARIANT: args.nohedge_schedule,
        f"pace-sync{AGAIN}": args.again_sync_schedule,
    }
    # The compiled modes whose schedule the compiler marked for Horovod's own path (its
    # replay predicted slower): pace.runtime.wrap then trains with hvd.DistributedOptimizer,
    # under Horovod's defaults as vanilla is (``_horovod_settings``), with no units to log.
    on_framework = frozenset(
        k for k, path in schedule_of.items() if path and load_schedule(path).framework
    )

    def make(kind: str) -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = vgg_cifar(NUM_CLASSES)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        if kind.startswith("local"):
            # The same marks and gradient times as the runtime's monitor gives its variants
            # (no units): `local`'s backward to the first unit's gradients, against the
            # runtime's (``local_backward_ms``).
            log = unit_logs.setdefault(kind, UnitLog())
            for i, p in enumerate(model.parameters()):
                p.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                    lambda _p, i=i: log.on_grad_ready(i, time.perf_counter() * 1e6)
                )
            return model, opt
        if kind in ("vanilla", "vanilla-nofusion"):
            if args.backend == "horovod":
                import horovod.torch as hvd

                return model, hvd.DistributedOptimizer(
                    opt, named_parameters=model.named_parameters()
                )
            from torch.nn.parallel import DistributedDataParallel

            ddp = DistributedDataParallel(model)
            return ddp, torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
        schedule = schedule_of.get(kind)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return model, pace.runtime.wrap(
                opt,
                model,
                schedule,
                backend=args.backend,
                monitor=None if kind in on_framework else unit_logs.setdefault(kind, UnitLog()),
                options=pace.runtime.RuntimeOptions(
                    sync=kind in SYNC_VARIANTS,
                    # pace-serial: the replay issuing a unit only once the last one is done,
                    # waiting for the runtime's threads between units (the default before
                    # the backends ran in order).
                    credit_bytes=1 if kind == "pace-serial" else None,
                ),
            )

    unit_logs: dict[str, UnitLog] = {}
    kinds = args.variants.split(",")
    runs = {k: make(k) for k in kinds}

    def block(kind: str, steps: int, *, timed: bool = True) -> list[float]:
        nonlocal current
        if args.backend == "horovod":
            want = _horovod_settings(kind, on_framework)
            if want != current:
                # Vanilla Horovod's defaults and the runtime's settings in one launch, so the
                # shared machine's load between launches is not part of their ratio: Horovod
                # reads them once per hvd.init(), and re-initialises after hvd.shutdown()
                # (what its elastic mode does). Nothing is in flight: every block ends drained.
                _reinit_horovod(want)
                current = want
                block(kind, 1, timed=False)  # the new loop's first iteration (cache, buffers)
            settings_seen.setdefault(kind, want)
        model, opt = runs[kind]
        log = unit_logs.get(kind)
        if log is not None:
            log.timing = timed
        starts = []
        ends = []  # after each iteration's step: an in-step `local`'s compute ends there
        busy_ms = []  # at the first and the last timed start: all the block's CPU reading needs
        used_ms = []  # this process's CPU by thread class at the same two starts
        timed_starts = (LEAD_IN, LEAD_IN + steps)
        stepped = in_step(kind)
        for i in range(iterations_per_block(steps)):
            if stepped:
                step_barrier(args.backend)
            t0 = time.perf_counter()
            starts.append(t0)
            if timed and i in timed_starts:
                busy_ms.append(host_busy_ms())
                used_ms.append(thread_cpu_ms())
            opt.zero_grad()
            loss = functional.cross_entropy(model(x), y)
            t1 = time.perf_counter()
            loss.backward()  # type: ignore[no-untyped-call]
            t2 = time.perf_counter()
            if timed and log is not None:
                log.marks.append((t0, t1, t2))
            opt.step()
            ends.append(time.perf_counter())
            if timed and LEAD_IN <= i < LEAD_IN + steps:  # where each period went
                phases[kind].append((t1 - t0, t2 - t1, ends[-1] - t2))
        if kind in RUNTIME_VARIANTS and kind not in on_framework:
            # Drain before the next variant's block (vanilla's step() did; so did Horovod's
            # own path, whose synchronize() with nothing pending would reduce every gradient).
            opt.synchronize()
        counted = starts[LEAD_IN:]
        if timed:  # how busy the host's cores were over the measured periods (cpu_floor_ms)
            cpu[kind].append((busy_ms[-1] - busy_ms[0], (counted[-1] - counted[0]) * 1e3, steps))
            threads[kind].append(({c: used_ms[-1][c] - used_ms[0][c] for c in used_ms[0]}, steps))
            lead_in[kind] += [b - a for a, b in itertools.pairwise(starts[: LEAD_IN + 1])]
        if stepped:
            # Each iteration's compute, from the barrier's release to the step's end: the
            # barrier's own wait (the faster rank's) and cost are not compute (``slower_rank``
            # then takes the slower rank's, as a job that communicates waits for).
            return [ends[i] - starts[i] for i in range(LEAD_IN, LEAD_IN + steps)]
        return [b - a for a, b in itertools.pairwise(counted)]

    phases: dict[str, list[tuple[float, float, float]]] = {k: [] for k in kinds}
    # Per variant, the timed blocks' lead-in periods (not counted; ``LEAD_IN``).
    lead_in: dict[str, list[float]] = {k: [] for k in kinds}
    # Per timed block: the host's busy core-ms, the block's wall ms, its periods.
    cpu: dict[str, list[tuple[float, float, int]]] = {k: [] for k in kinds}
    # Per timed block: this rank's CPU ms by thread class (``thread_cpu_ms``), its periods.
    threads: dict[str, list[tuple[dict[str, float], int]]] = {k: [] for k in kinds}

    # With Horovod, the variants under its defaults first, then the rest (``by_settings``): the
    # blocks alternate direction, so the ranks re-initialise Horovod once per pass, not at
    # every switch of the variants' own order.
    order = by_settings(kinds, on_framework) if args.backend == "horovod" else kinds
    for k in order:
        block(k, 2, timed=False)  # warm-up (DDP rebuilds its buckets after the first iteration)
    periods: dict[str, list[float]] = {k: [] for k in kinds}
    for b in range(args.blocks):
        for k in order if b % 2 == 0 else order[::-1]:
            periods[k] += block(k, args.steps)
    for _, opt in runs.values():
        if hasattr(opt, "close"):
            opt.close()
    # Every rank's periods: where the ranks synchronise, an iteration waits for the slower
    # one (``slower_rank``).
    Path(f"{args.out}.rank{rank}").write_text(json.dumps(periods))
    Path(f"{args.out}.threads.rank{rank}").write_text(json.dumps(threads))
    for kind, log in unit_logs.items():  # what each unit held the channel for (merged_units)
        if kind in RUNTIME_VARIANTS:  # `local`: no units, only marks and gradients
            Path(f"{args.out}.{kind}.units.rank{rank}").write_text(json.dumps(log.done))
        Path(f"{args.out}.{kind}.marks.rank{rank}").write_text(json.dumps(log.marks))
        Path(f"{args.out}.{kind}.grads.rank{rank}").write_text(json.dumps(log.grads))
    if rank == 0:
        Path(args.out).write_text(json.dumps(periods))
        Path(f"{args.out}.phases").write_text(json.dumps(phases))
        Path(f"{args.out}.cpu").write_text(json.dumps(cpu))
        Path(f"{args.out}.lead_in").write_text(json.dumps(lead_in))
        if settings_seen:
            Path(f"{args.out}.settings").write_text(json.dumps(settings_seen))


def under_defaults(kind: str, on_framework: frozenset[str] = frozenset()) -> bool:
    """``kind`` trains under Horovod's defaults (fusion, cache), not the runtime's settings:
    vanilla, its `local@vanilla`, `pace@path`, and a compiled mode whose schedule trains with
    Horovod's own path (``on_framework``)."""
    return kind in DEFAULT_SETTINGS_VARIANTS or kind in on_framework


def _horovod_settings(
    kind: str | None = None, on_framework: frozenset[str] = frozenset()
) -> dict[str, str | None]:
    """The Horovod variables that ``kind``'s blocks run under (vanilla Horovod and its
    ``local@vanilla``, and a compiled mode whose schedule trains with Horovod's own path
    (``on_framework``): Horovod's defaults; the rest: the runtime's, with ``--horovod-env``);
    no kind: the current environment's."""
    pace_env = pace_horovod_env()
    if kind is None:
        return {k: os.environ.get(k) for k in pace_env}
    if under_defaults(kind, on_framework):
        return dict.fromkeys(pace_env)
    return dict(pace_env)


def by_settings(kinds: Sequence[str], on_framework: frozenset[str] = frozenset()) -> list[str]:
    """``kinds`` with those under Horovod's defaults first (``_horovod_settings``), each
    group in its given order. A re-initialisation costs a few seconds and is where Horovod 0.28
    has crashed (``_reinit_horovod``); grouped, a launch alternating its blocks' direction
    switches once per pass, where `vanilla, local@vanilla, vanilla-nofusion, online, pace, ...`
    with `pace` on Horovod's path switched three times."""
    return sorted(kinds, key=lambda k: not under_defaults(k, on_framework))  # stable


def _reinit_horovod(settings: dict[str, str | None]) -> None:
    import horovod.torch as hvd

    hvd.shutdown()
    for key, value in settings.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    hvd.init()


# --------------------------------------------------------------------------- orchestration


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    rate: str
    backend: str
    variant: str
    measured_ms: float
    spread_ms: float  # interquartile range of the per-iteration periods
    # The 95% confidence interval of measured_ms (a bootstrap over the periods): how far the
    # run's own median may be from the period this variant has, on this noisy shared host.
    median_ci_ms: tuple[float, float] | None = None
    # With the measured interference term, before the run: with --handoff from the
    # calibration launch's compute (`local` rows: that launch's `local`), else the profile's.
    predicted_ms: float | None
    independent_ms: float | None  # without it: compute and communication independent
    # No schedule of any kind beats this on the rate's fitted link: CompileResult.lower_bound_us
    # (the zero-overhead optimal preemptive makespan, raised to pace.lp.interference_bound_us
    # under the pace launch's interference term), with --handoff from this launch's own
    # `local` compute (``launch_bound_ms``); no step: the overlapped mode updates in the
    # background (STEP_IN_BACKGROUND).
    bound_ms: float | None = None
    # The runtime's variants: their units' channel time per iteration (the unit logs), and the
    # replay's (with the interference term). Where a period is mispredicted, these say whether
    # the communication or the computation was slower than the model.
    channel_ms: float | None = None
    predicted_channel_ms: float | None = None
    # The overlapped modes: where their channel idled in an iteration, measured (the unit logs
    # and the iterations' marks, ``measured_idle``) and in the replay (``replay_idle``).
    idle: IdleSplit | None = None
    predicted_idle: IdleSplit | None = None
    # The same replay with the compute measured under the variant's own settings (its `local`
    # run: the profile's compute scaled to it, the backend's idle loss included): the model of
    # communication and interference alone, without the shared machine's drift since the
    # profile. Not for the `local` rows, which calibrate it.
    calibrated_ms: float | None = None
    # The calibration launch's own median for the same program (the variant; for the
    # runtime's, the same schedule), minutes earlier (``repeat_ms``): how far the measurement
    # itself moves between two launches on this shared host. No prediction made from that
    # launch can be expected nearer than this.
    repeat_ms: float | None = None
    # The fraction of the host's cores busy over this variant's timed blocks (both ranks, and
    # the kernel's network work).
    cores_busy: float | None = None
    # No schedule that costs the cores as much as the cheapest communicating variant of this
    # launch beats this (``cpu_floor_ms``): where vanilla already keeps the cores busy,
    # overlapping its communication has no idle core to fill.
    cpu_floor_ms: float | None = None


def profile_trace(batch: int, out: Path) -> Any:
    """The model's trace: real iterations on this CPU, one thread (the compute every row uses)."""
    from pace.io import save_trace
    from pace.profiler import profile
    from pace.profiler.workloads import build_workload

    w = build_workload(MODEL, batch_size=batch, num_classes=NUM_CLASSES)
    trace = profile(w.model, w.step_fn, optimizer=w.optimizer, iters=7, warmup=3, name=MODEL)
    save_trace(trace, out)
    return trace


def with_update(comm: Any, trace: Any) -> Any:
    """``comm`` with the update the overlapped runtime runs as each unit completes (the
    optimizer step on its parameters, on the completion thread, before the forward may use
    them): the profile's ``update_us_per_byte``, else its step per byte of gradient; and the
    profile's copy-back of fused units (``copy_us_per_byte``)."""
    per_byte = trace.comm.update_us_per_byte or _step_us(trace) / trace.total_bytes
    return dataclasses.replace(
        comm, update_us_per_byte=per_byte, copy_us_per_byte=trace.comm.copy_us_per_byte
    )


def fit_link(link: Link, backend: str, trace: Any, tmp: Path, reps: int) -> Any:
    """All-reduce cost over the link as ``CommModel`` (with its samples), and its R^2."""
    from pace.profiler.comm import sizes_covering

    sizes = sizes_covering([t.size_bytes for t in trace.tensors], points=8)
    # Also the online mode's 4 MiB pieces, and fused buffers as large as DDP's 25 MiB buckets:
    # the per-byte cost is what decides a bandwidth-bound iteration.
    sizes = sorted(set(sizes) | {4 * 2**20, 16 * 2**20, 32 * 2**20})
    out = tmp / f"comm-{backend}.json"
    argv = ["--role", "comm", "--backend", backend, "--out", str(out)]
    argv += ["--sizes", ",".join(map(str, sizes)), "--reps", str(reps)]
    launch(link, backend, argv, pace_horovod_env() if backend == "horovod" else None)
    rows = json.loads(out.read_text())
    samples = [(int(b), float(u)) for b, u, _ in rows]
    _say("    all-reduce samples (bytes: us): " + ", ".join(f"{b}: {u:.0f}" for b, u in samples))
    big = max(rows, key=lambda r: r[0])
    _say(
        f"    CPU of rank 0 while all-reducing {big[0] / 2**20:.0f} MiB: {big[2] / 1e3:.0f} ms "
        f"in {big[1] / 1e3:.0f} ms ({big[2] / big[0] * 2**20 / 1e3:.2f} ms per MiB)"
    )
    comm = fit_absolute(samples)
    if backend != "horovod":
        return comm
    from pace.profiler.comm import read_batches, with_batches

    batches = read_batches(f"{out}.batches")
    comm = with_batches(comm, batches)
    assert comm.batched_alpha_us is not None  # with_batches sets it
    _say(
        "    tiny tensors issued at once (count: median ms): "
        + ", ".join(f"{k}: {us / 1e3:.2f}" for k, us in batches.medians_us.items())
        + f"; line: first call {batches.first_call_us / 1e3:.2f} ms, each further "
        f"{batches.further_call_us / 1e3:.2f} ms (R^2 {batches.r2:.3f}); batched alpha "
        f"{comm.batched_alpha_us / 1e3:.2f} ms against the fit's alpha {comm.alpha_us / 1e3:.2f} ms"
    )
    return comm


INTERFERENCE_SIZES = (256 * 2**10, 2**20, 4 * 2**20, 16 * 2**20)
INTERFERENCE_WINDOW_US = 3_000_000.0  # back-to-back calls of one size last about this long
PROBE_REPS = 9  # training steps timed before the backend starts (plain); ~0.4 s each
IDLE_REPS = 15  # ... and with it idle, in chunks around the sizes (3 per chunk)


def fit_link_interference(
    link: Link, backend: str, comm: Any, tmp: Path, *, env: dict[str, str] | None, tag: str
) -> Any:
    """The link's interference term (``pace.ir.Interference``), measured in a launch with
    ``env`` (Horovod's settings change its background loop), averaged over both ranks."""
    from pace.profiler.interference import combine_ranks, fit_interference

    call_us = [comm.cost_us(size) for size in INTERFERENCE_SIZES]
    out = tmp / f"interference-{backend}-{tag}.json"
    argv = ["--role", "interference", "--backend", backend, "--out", str(out)]
    argv += ["--sizes", ",".join(map(str, INTERFERENCE_SIZES))]
    argv += ["--calls", ",".join(f"{us:.3f}" for us in call_us)]
    launch(link, backend, argv, env)
    plain, idle, samples = combine_ranks(str(out), 2)
    term, r2 = fit_interference(plain, idle, samples)
    _say(
        f"    interference ({tag}): probe {plain:.0f} us plain, {idle:.0f} us idle "
        f"(idle loss {term.idle_loss:.3f}); loss while all-reducing "
        + ", ".join(f"{x.size_bytes // 1024} KiB: {x.loss:.3f}" for x in samples)
        + f"; fit {term.us_per_call:.1f} us/call + {term.us_per_byte * 2**20:.0f} us/MiB,"
        f" R^2 {r2:.3f}; calls beside compute take "
        + ", ".join(f"{x.call_us / x.alone_us:.2f}x" for x in samples if x.alone_us)
        + f" (fit: +{term.comm_us_per_call / 1e3:.2f} ms per call, stretch"
        f" {term.comm_stretch:.3f})"
    )
    return term


def fit_absolute(samples: Sequence[tuple[int, float]]) -> Any:
    """``alpha + beta * bytes`` by plain (absolute) non-negative least squares.

    Not ``pace.cost.fit_linear``'s relative fit: a tc token bucket is not an alpha-beta link.
    Messages that fit in its burst (125 KB here) pass at memory speed, so mid-size samples
    look cheap per byte and a fit on relative errors under-charges the multi-MB messages that
    carry almost all of an iteration's bytes. Absolute residuals let those decide beta.
    """
    import numpy as np
    from scipy.optimize import nnls

    from pace.ir import CommModel

    x = np.array([b for b, _ in samples], dtype=float)
    y = np.array([u for _, u in samples], dtype=float)
    scale = float(x.max())
    (alpha, beta), _ = nnls(np.column_stack([np.ones_like(x), x / scale]), y)
    return CommModel(
        workers=2,
        alpha_us=float(alpha),
        beta_us_per_byte=float(beta) / scale,
        samples=tuple((int(b), float(u)) for b, u in samples),
    )


@dataclass(frozen=True)
class AsRun:
    """How the variants ran, where the trace alone does not say, per variant:

    - ``terms``: the interference term it runs with (``"*"`` for the rest); none: compute and
      communication as independent;
    - ``comms``: the cost of its calls where it is not the trace's (vanilla Horovod's fused
      calls, ``fit_vanilla_channel``);
    - ``steps_us``: the optimizer step its training thread took in a launch, where that was
      measured (``step_measured``); the rest take the profile's;
    - ``forwards_over_us``: how much longer than `local`'s its forward took in a launch, where
      the replay charges the forward at `local`'s speed although it ran slower
      (``forward_measured``).
    """

    terms: dict[str, Any] = dataclasses.field(default_factory=dict)
    comms: dict[str, Any] = dataclasses.field(default_factory=dict)
    steps_us: dict[str, float] = dataclasses.field(default_factory=dict)
    forwards_over_us: dict[str, float] = dataclasses.field(default_factory=dict)

    def term(self, variant: str) -> Any:
        return self.terms.get(variant, self.terms.get("*"))


@dataclass(frozen=True)
class IdleSplit:
    """Where the channel idled in an iteration of an overlapped mode (pace, online), ms:

    - ``tail``: from the end of the last iteration's last unit to the end of the forward that
      waited for it (the forward after that unit; measured, also the runtime's wake-up and
      the update of its parameters);
    - ``head``: from there to the start of this iteration's first unit (the loss, the backward
      until the unit's gradients are ready on every rank; measured, also its issue);
    - ``within``: between this iteration's units (the next unit's gradients not ready yet).

    The period is the channel's busy time plus these three."""

    tail_ms: float
    head_ms: float
    within_ms: float
    # The head on the rank that issued the first unit last (the one the channel waited for),
    # measured only: from its forward's end to the last gradient marked ready before it
    # issued the unit (the backward up to the unit's gradients: what the replay's head is),
    # then to its issue (the runtime's dispatch and the unit's packing); and how much later
    # it issued than the other rank (the ranks' skew).
    head_backward_ms: float | None = None
    head_dispatch_ms: float | None = None
    head_skew_ms: float | None = None
    # How many gradients that rank had marked ready after its forward's end when it issued the
    # unit (median), and how long `local`'s backward took to mark as many in the same launch
    # (``local_backward_ms``, its slower rank): the same stretch of compute without the
    # runtime or its collectives.
    head_gradients: int | None = None
    head_local_ms: float | None = None
    # The other rank (the one that issued first): from its forward's end to as many gradients
    # (median), and `local`'s faster rank to as many: beside the two above, whether the
    # runtime's head is slower on both ranks or only on the one the channel waited for.
    head_ahead_ms: float | None = None
    head_local_ahead_ms: float | None = None


class Predicted(NamedTuple):
    """A variant's replay (``simulate_variants``): its period and the channel's busy time, ms;
    for the overlapped modes also where the replay's channel idled (``IdleSplit``)."""

    period_ms: float
    channel_ms: float
    idle: IdleSplit | None = None


def replay_idle(result: Any) -> IdleSplit:
    """Where the channel of a replay (``pace.sim``'s result, one unit at a time on the
    channel) idles: before its first unit (the backward until it is ready), between its units,
    and after its last one (the forward that waits for it)."""
    spans = sorted(zip(result.unit_start_us, result.unit_finish_us, strict=True))
    within = sum(max(0.0, b[0] - a[1]) for a, b in itertools.pairwise(spans))
    return IdleSplit(
        tail_ms=(result.iteration_us - spans[-1][1]) / 1e3,
        head_ms=spans[0][0] / 1e3,
        within_ms=within / 1e3,
    )


def predictions_ms(
    trace: Any,
    schedule: Any,
    sync_schedule: Any,
    backend: str,
    *,
    as_run: AsRun | None = None,
) -> dict[str, float]:
    """The simulator's replay of each variant, plus the optimizer step where the training
    thread runs it (``simulate_variants``)."""
    sims = simulate_variants(trace, schedule, sync_schedule, backend, as_run=as_run)
    return {k: p.period_ms for k, p in sims.items()}


def simulate_variants(
    trace: Any,
    schedule: Any,
    sync_schedule: Any,
    backend: str,
    *,
    as_run: AsRun | None = None,
) -> dict[str, Predicted]:
    """Per variant, in ms: the predicted period (the replay, plus the step where the training
    thread runs it: ``STEP_IN_BACKGROUND``), how long the replay's channel was busy (what
    the runtime's unit logs measure) and, for the overlapped modes, where it idled."""
    from pace.compiler import sync_trace
    from pace.runtime import ONLINE_CREDIT_BYTES, RuntimeOptions
    from pace.sim import SimOptions, schedule_policy, simulate
    from pace.sim.policies import bytescheduler, horovod

    run = as_run or AsRun()

    def on(variant: str) -> Any:
        comm = run.comms.get(variant, trace.comm)
        # The overlapped modes update each unit's parameters as it completes, before the
        # forward may use them; the others step on the training thread (``step``).
        update = trace.comm.update_us_per_byte if variant in STEP_IN_BACKGROUND else 0.0
        # pace's runtime copies a fused unit's buffer back on its completion thread, in both
        # modes; the frameworks' calls copy inside their fitted cost.
        copy = trace.comm.copy_us_per_byte if variant in RUNTIME_VARIANTS else 0.0
        return dataclasses.replace(
            trace,
            comm=dataclasses.replace(
                comm,
                interference=run.term(variant),
                update_us_per_byte=update,
                copy_us_per_byte=copy,
            ),
        )

    def slow(variant: str) -> float:
        term = run.term(variant)
        return 1.0 / (1.0 - term.idle_loss) if term is not None else 1.0

    def step(variant: str) -> float:
        if variant in STEP_IN_BACKGROUND:
            return 0.0
        return run.steps_us.get(variant, profiled_step_us * slow(variant))

    opts = RuntimeOptions()
    profiled_step_us = _step_us(trace)
    # The online mode's 16 MiB credit lets 4 pieces of 4 MiB be in flight. Both backends run
    # the runtime's collectives one at a time, in issue order (Horovod's background thread,
    # the runtime's one-thread gloo group), so the 4 are a queue, committed when issued; and
    # a piece goes only once every rank knows its gradient is ready (the readiness bitmaps).
    online = bytescheduler(partition_bytes=opts.partition_bytes, credit_bytes=ONLINE_CREDIT_BYTES)
    queued = SimOptions(queued=True, agreed_readiness=True)
    # The runtime replays a schedule one unit at a time on the link, strictly in priority
    # order, each unit once its gradients are ready (queued ahead or issued one by one, the
    # same order). On the trace it was compiled for, that is the contract's replay; on the
    # launch's timings a schedule compiled for others can be started in another order by the
    # contract's replay, which sends a ready later unit first (the calibration's schedule at
    # 0.5 Gbit/s with Horovod: 1152 ms by the contract, 1061 ms measured).
    pace_sim = simulate(on("pace"), schedule_policy(schedule, in_order=True))
    sims = {
        "pace": pace_sim,
        "pace-serial": pace_sim,
        "pace-sync": simulate(
            sync_trace(on("pace-sync")), schedule_policy(sync_schedule, in_order=True)
        ),
        "online": simulate(on("online"), online, options=queued),
    }
    if backend == "horovod":
        sims["vanilla"] = simulate(on("vanilla"), "horovod")
        # Horovod's cycles with fusion off: each tensor its own call, a cycle's calls
        # negotiated together (``CommModel.batched_alpha_us``, measured by the comm fit).
        sims["vanilla-nofusion"] = simulate(
            on("vanilla-nofusion"), horovod(threshold_bytes=0, name="horovod-nofusion")
        )
    else:
        sims["vanilla"] = simulate(on("vanilla"), "ddp")
    out = {
        k: Predicted(
            (r.iteration_us + step(k) + run.forwards_over_us.get(k, 0.0)) / 1e3,
            r.comm_busy_us / 1e3,
            replay_idle(r) if k in STEP_IN_BACKGROUND and r.units else None,
        )
        for k, r in sims.items()
    }
    # A compiled mode whose schedule trains with Horovod's own path runs as vanilla does.
    if "vanilla" in out:
        for k in on_framework_modes(schedule, sync_schedule):
            out[k] = out["vanilla"]
    # No communication at all: only a backend's idle loss slows compute.
    compute_ms = _compute_us(trace) / 1e3
    out["local"] = Predicted(compute_ms * slow("local"), 0.0)
    if backend == "horovod":
        out["local@vanilla"] = Predicted(compute_ms * slow("vanilla"), 0.0)
    return out


def _compute_us(trace: Any) -> float:
    """Compute alone: the critical path of forward and backward, plus the optimizer step."""
    return compute_only_us(trace) + _step_us(trace)


def _step_us(trace: Any) -> float:
    """The optimizer step the profile measured."""
    return float(trace.meta.get("optimizer_us", 0.0))


def _local_ms(periods: dict[str, list[float]]) -> dict[str, float]:
    """The median period of each `local` run in ``periods`` (seconds per variant), in ms."""
    return {k: statistics.median(v) * 1e3 for k, v in periods.items() if k.startswith("local")}


def in_job(trace: Any, local_ms: float) -> Any:
    """``trace`` with its op durations and optimizer step scaled so that compute alone (the
    critical path plus the step) takes ``local_ms``: what a profile taken inside the job would
    have measured (two ranks on the cores, the backend idling beside them)."""
    from pace.compiler import apply_what_if

    step_us = _step_us(trace)
    scale = local_ms * 1e3 / _compute_us(trace)
    # The what-if's compute speed-up scales the ops; the step is outside the replay.
    faster = apply_what_if(trace, compute_speedup=1.0 / scale)
    return dataclasses.replace(faster, meta={**faster.meta, "optimizer_us": step_us * scale})


def reshaped(trace: Any, local_ms: float, ready_ms: Sequence[float]) -> Any:
    """``trace`` in the shape of the compute a job's `local` run measured: its backward warped
    (``pace.drift.estimate.warp_backward``) so that its k-th gradient is ready when `local`
    marked its k-th (``ready_ms``, from ``local_ready_ms``: the slower rank's, as the channel
    waits for it), its forward and step scaled so that compute alone takes ``local_ms``, then
    all of it scaled back to the trace's own compute (``in_job`` scales it to each launch's).

    ``in_job`` alone keeps the profile's shape, and the job's is another: beside the other rank
    on the cores the last convolutions' backward (the first 28 MiB of gradients, where the
    schedules start) took 1.24-1.93x their share of the profile in the six calibration launches
    of a full run, the later gradients 0.99-1.07x, the forward 0.87-1.03x; with the profile's
    shape the replay had the first large gradient ready 20-90 ms early and missed the channel's
    idle head by about that (2026-11-27, docs/results.md). The trace is returned unchanged
    where the curve does not hold one time per tensor or the backward alone takes
    ``local_ms``."""
    from scipy.optimize import brentq

    from pace.drift.estimate import phase_scaled_ops, trace_spans, warp_backward

    if len(ready_ms) != len(trace.tensors):
        return trace
    ideal = trace_spans(trace).ready_us
    order = sorted(ideal, key=ideal.__getitem__)  # the order the gradients become ready
    warped = warp_backward(trace, {n: ms * 1e3 for n, ms in zip(order, ready_ms, strict=True)})
    step_us = _step_us(trace)

    def with_forward(scale: float) -> Any:
        ops = phase_scaled_ops(warped, forward_scale=scale, backward_scale=1.0)
        meta = {**warped.meta, "optimizer_us": step_us * scale}
        return dataclasses.replace(warped, ops=ops, meta=meta)

    def miss_us(scale: float) -> float:
        return _compute_us(with_forward(scale)) - local_ms * 1e3

    if miss_us(0.0) >= 0.0:
        return trace
    hi = 1.0
    while miss_us(hi) < 0.0:
        hi *= 2.0
    shaped = with_forward(float(brentq(miss_us, 0.0, hi, xtol=1e-9)))
    return in_job(shaped, _compute_us(trace) / 1e3)


def simulate_in_job(
    trace: Any,
    schedule: Any,
    sync_schedule: Any,
    backend: str,
    *,
    as_run: AsRun,
    local_ms: dict[str, float],
) -> dict[str, Predicted]:
    """``simulate_variants`` with the compute measured in a launch: per variant, the profile
    scaled (``in_job``) to the `local` run under the same settings (``local_of``; ``local_ms``
    by that name). That run already paid the backend's idle loss, so the terms' idle loss is
    dropped. Variants whose `local` is not in ``local_ms`` are left out; so are the `local`s."""
    idle_free = dataclasses.replace(
        as_run,
        terms={k: dataclasses.replace(t, idle_loss=0.0) for k, t in as_run.terms.items()},
    )
    on_framework = on_framework_modes(schedule, sync_schedule)
    out: dict[str, Predicted] = {}
    for local, ms in local_ms.items():
        sims = simulate_variants(
            in_job(trace, ms), schedule, sync_schedule, backend, as_run=idle_free
        )
        out |= {
            v: sim
            for v, sim in sims.items()
            if not v.startswith("local") and local_of(v, backend, on_framework) == local
        }
    return out


def launch_bound_ms(compiled: Any, measured: dict[str, list[float]]) -> float:
    """The lower bound the compiler reports (``pace.lp.lower_bound_us``) on ``compiled`` with
    its compute scaled (``in_job``) to what the launch's own `local` took (``measured``:
    periods in seconds per variant). The compiler's bound holds for the calibration launch's
    compute; where the timed launch computed faster, `pace` measured below it (1 Gbit/s with
    Horovod: 765.0 ms against a bound of 808.1, the launch's `local` 15% faster), and the
    most any schedule could gain, taken from it, said "out of reach" of a goal the launch
    could reach."""
    from pace.lp import lower_bound_us

    return float(lower_bound_us(in_job(compiled, _local_ms(measured)["local"]))) / 1e3


def launch_calibrated_ms(
    trace: Any,
    schedule: Any,
    sync_schedule: Any,
    backend: str,
    *,
    as_run: AsRun,
    measured: dict[str, list[float]],
) -> dict[str, float]:
    """Per variant: the period predicted with the compute that ``measured``'s `local` runs
    took (``simulate_in_job``); ``measured``: periods in seconds per variant, as the workers
    write them."""
    sims = simulate_in_job(
        trace,
        schedule,
        sync_schedule,
        backend,
        as_run=as_run,
        local_ms=_local_ms(measured),
    )
    return {v: p.period_ms for v, p in sims.items() if v in measured}


def measure(args: argparse.Namespace) -> list[Row]:
    from pace.compiler import compile_trace
    from pace.io import load_trace, save_schedule, save_trace, write_atomic

    tmp = Path(tempfile.mkdtemp(prefix="pace-netns-"))
    try:
        trace_path = tmp / "vgg.trace.json.gz"
        if args.trace:
            trace_path = Path(args.trace)
            base = load_trace(trace_path)
        else:
            _say(f"profiling {MODEL}, batch {args.batch}, one CPU thread ...")
            base = profile_trace(args.batch, trace_path)
            _say(
                f"    compute {_compute_us(base) / 1e3:.1f} ms (step {_step_us(base) / 1e3:.1f}"
                f" ms); the runtime's copy-back of a fused unit "
                f"{base.comm.copy_us_per_byte * 2**20 / 1e3:.3f} ms per MiB"
            )
        rows: list[Row] = []
        with throttled_link() as link:
            for rate in args.rates.split(","):
                set_rate(link, rate)
                for backend in args.backends.split(","):
                    _say(f"[{rate} {backend}] fitting the all-reduce cost over the link ...")
                    comm = fit_link(link, backend, base, tmp, args.comm_reps)
                    _say(
                        f"[{rate} {backend}] alpha {comm.alpha_us:.0f} us, "
                        f"{8e-3 / comm.beta_us_per_byte:.3f} Gbit/s effective; compiling ..."
                    )
                    terms = {
                        "*": fit_link_interference(
                            link,
                            backend,
                            comm,
                            tmp,
                            env=pace_horovod_env() if backend == "horovod" else None,
                            tag="pace",
                        )
                    }
                    if backend == "horovod":  # vanilla Horovod runs with its own settings
                        terms["vanilla"] = fit_link_interference(
                            link, backend, comm, tmp, env=None, tag="vanilla"
                        )
                    trace = dataclasses.replace(base, comm=with_update(comm, base))
                    # The runtime's own units beside compute (issue, completion, negotiation,
                    # packing), measured before compiling by training a few iterations with the
                    # schedule the probe's term compiles to: their channel time fitted as a
                    # per-call delay and a stretch, and what compute lost beside them as the
                    # per-call and per-byte loss. With --handoff it replaces the probe's for
                    # the variants the runtime drives and for the compiler, which then compiles
                    # again; vanilla gets what the launch measured of it too (``fit_calibration``).
                    runtime_term = terms["*"]
                    job_local_ms: dict[str, float] = {}  # the calibration run's compute
                    shaped = trace  # the compute's shape: the profile's, or the job's
                    as_run = AsRun(terms=terms)
                    cal: Calibration | None = None
                    if args.handoff or args.report_handoff:
                        cal = calibrate_handoff(
                            link, backend, trace, terms=terms, tmp=tmp, args=args
                        )
                        if args.handoff:
                            comm = cal.comm
                            trace = dataclasses.replace(trace, comm=comm)
                            runtime_term = cal.as_run.terms["pace"]
                            as_run = dataclasses.replace(cal.as_run, terms=terms | cal.as_run.terms)
                            job_local_ms = _local_ms(cal.periods)
                            shaped = cal.trace
                            _say(
                                "    compute in the calibration run / in the profile: "
                                f"{job_local_ms['local'] * 1e3 / _compute_us(trace):.3f}"
                            )
                    # The compiler sees the link as it is, interference included; with
                    # --handoff, the compute as the job measured it (two ranks on the cores,
                    # the backend idling beside them), not as one process alone did.
                    job = in_job(shaped, job_local_ms["local"]) if job_local_ms else trace
                    compiled = dataclasses.replace(
                        job,
                        comm=dataclasses.replace(
                            job.comm,
                            interference=dataclasses.replace(runtime_term, idle_loss=0.0)
                            if job_local_ms
                            else runtime_term,
                            framework=framework_path(backend, as_run) if job_local_ms else None,
                        ),
                    )
                    # The loss the calibration fitted absorbs what the replay misses at the
                    # iteration's boundary, so it is the uncertain part: the compiler hedges
                    # between it and the probe's (``pace.hedge``).
                    hedge = [probe_loss(compiled, terms["*"])] if job_local_ms else []
                    result = compile_trace(compiled, hedge=hedge, compute_hedge=HEDGE_COMPUTE)
                    sched_path = tmp / f"{rate}-{backend}.schedule.json"
                    save_schedule(result.schedule, sched_path)
                    sync_result = compile_trace(
                        compiled,
                        mode="sync",
                        baselines=False,
                        hedge=hedge,
                        compute_hedge=HEDGE_COMPUTE,
                    )
                    sync = sync_result.schedule
                    for mode, compiled_mode in (("pace", result.schedule), ("pace-sync", sync)):
                        _say_hedge(mode, compiled_mode)
                        _say_compute_hedge(mode, compiled_mode)
                    _say_framework("pace", result)
                    _say_framework("pace-sync", sync_result)
                    sync_path = tmp / f"{rate}-{backend}.sync.schedule.json"
                    save_schedule(sync, sync_path)
                    others = {}
                    if args.compare_joins:
                        others[NOJOIN_VARIANT] = compile_trace(
                            compiled, hedge=hedge, compute_hedge=HEDGE_COMPUTE, join_units=False
                        ).schedule
                        _say(
                            f"    {NOJOIN_VARIANT}: {len(others[NOJOIN_VARIANT].units)} units, "
                            f"predicted {others[NOJOIN_VARIANT].predicted_iteration_us / 1e3:.1f}"
                            f" ms; pace: {len(result.schedule.units)} units, predicted "
                            f"{result.schedule.predicted_iteration_us / 1e3:.1f} ms"
                        )
                    if args.compare_hedge:
                        nominal = compile_trace(compiled).schedule
                        others[NOHEDGE_VARIANT] = nominal
                        _say(
                            f"    {NOHEDGE_VARIANT}: {len(nominal.units)} units, predicted "
                            f"{nominal.predicted_iteration_us / 1e3:.1f} ms"
                            + (
                                " (the same program as pace's)"
                                if _program(nominal) == _program(result.schedule)
                                else ""
                            )
                        )
                    other_paths = {v: tmp / f"{rate}-{backend}.{v}.schedule.json" for v in others}
                    for v, schedule in others.items():
                        save_schedule(schedule, other_paths[v])
                    # The calibration's schedules the compiler replaced, trained again in the
                    # timed launch: their repeat is how far a compiled mode's program moved.
                    again = (
                        again_schedules(cal, {"pace": result.schedule, "pace-sync": sync})
                        if cal is not None and job_local_ms
                        else {}
                    )
                    again_paths = {v: tmp / f"{rate}-{backend}.{v}.schedule.json" for v in again}
                    for v, schedule in again.items():
                        save_schedule(schedule, again_paths[v])
                    programs = ((result.schedule, sync), cal, again, others)
                    if args.keep:  # the trace the schedules were compiled from, and every one
                        keep = Path(args.keep)
                        keep.mkdir(parents=True, exist_ok=True)
                        save_trace(compiled, keep / f"{rate}-{backend}.trace.json.gz")
                        for alt in hedge:
                            save_trace(alt, keep / f"{rate}-{backend}.probe-loss.trace.json.gz")
                        # The sync mode's, the other variants' (pace-nojoin, pace-nohedge) and
                        # the calibration's trained again: every program the launch trained.
                        for path in (
                            sched_path,
                            sync_path,
                            *other_paths.values(),
                            *again_paths.values(),
                        ):
                            shutil.copy(path, keep / path.name)
                    if job_local_ms:  # every prediction from the calibration run's compute
                        sims = of_programs(
                            functools.partial(
                                simulate_in_job,
                                shaped,
                                backend=backend,
                                as_run=as_run,
                                local_ms=job_local_ms,
                            ),
                            *programs,
                        )
                        sims |= {k: Predicted(ms, 0.0) for k, ms in job_local_ms.items()}
                    else:
                        sims = simulate_variants(
                            trace, result.schedule, sync, backend, as_run=as_run
                        )
                    pred = {k: p.period_ms for k, p in sims.items()}
                    if args.keep:  # the predictions beside the programs (bench_reachable.py)
                        write_atomic(
                            Path(args.keep) / f"{rate}-{backend}.predicted.json",
                            json.dumps({"predicted_ms": pred}, indent=1).encode(),
                        )
                    independent = of_programs(
                        functools.partial(predictions_ms, trace, backend=backend), *programs
                    )
                    measured = _train(
                        link, backend, sched_path, tmp, args, again=again_paths, others=other_paths
                    )
                    ratio = statistics.median(measured["local"]) * 1e3 / independent["local"]
                    # The bound with the compute this launch measured, as `calibrated` is.
                    bound_ms = (
                        launch_bound_ms(compiled, measured)
                        if job_local_ms
                        else result.lower_bound_us / 1e3
                    )
                    _say(f"    compute in the run / in the profile: {ratio:.3f}")
                    calibrated = of_programs(
                        functools.partial(
                            launch_calibrated_ms,
                            shaped,
                            backend=backend,
                            as_run=as_run,
                            measured=measured,
                        ),
                        *programs,
                    )
                    _report_units(tmp / f"train-{backend}.json.pace.units", comm, result.schedule)
                    cores = os.cpu_count() or 1
                    cpu = read_cpu(tmp / f"train-{backend}.json.cpu", cores)
                    median_ms = {k: statistics.median(p) * 1e3 for k, p in measured.items()}
                    floor_ms = cpu_floor_ms({k: busy for k, (_, busy) in cpu.items()}, median_ms)
                    by_thread = read_threads(
                        tmp / f"train-{backend}.json", {k: c for k, (c, _) in cpu.items()}
                    )
                    for kind, (core_ms, busy) in cpu.items():
                        split = ", ".join(
                            f"{c} {v:.0f}" for c, v in by_thread.get(kind, {}).items()
                        )
                        _say(
                            f"    {kind}: {core_ms:.0f} core-ms per iteration, {busy:.1%} busy"
                            + (f" ({split})" if split else "")
                        )
                    _say(lead_in_report(tmp / f"train-{backend}.json.lead_in", median_ms))
                    iterations = args.blocks * iterations_per_block(args.steps)
                    repeat = (
                        repeat_ms(cal, {"pace": result.schedule, "pace-sync": sync})
                        if cal is not None
                        else {}
                    )
                    for variant, periods in measured.items():
                        rows.append(
                            Row(
                                rate=rate,
                                backend=backend,
                                variant=variant,
                                measured_ms=median_ms[variant],
                                spread_ms=iqr(periods) * 1e3,
                                median_ci_ms=median_ci_ms(periods),
                                predicted_ms=pred.get(variant),
                                independent_ms=independent.get(variant),
                                bound_ms=bound_ms,
                                channel_ms=_channel_per_iteration_ms(
                                    tmp / f"train-{backend}.json.{variant}.units", iterations
                                ),
                                predicted_channel_ms=(
                                    sims[variant].channel_ms if variant in sims else None
                                ),
                                idle=_idle_of(
                                    tmp / f"train-{backend}.json.{variant}",
                                    iterations_per_block(args.steps),
                                    tmp / f"train-{backend}.json.{local_of(variant, backend)}",
                                ),
                                predicted_idle=sims[variant].idle if variant in sims else None,
                                calibrated_ms=calibrated.get(variant),
                                repeat_ms=repeat.get(variant),
                                cores_busy=cpu.get(variant, (None, None))[1],
                                cpu_floor_ms=floor_ms,
                            )
                        )
                    _print_rows([r for r in rows if r.rate == rate and r.backend == backend])
                    if args.keep:
                        keep_launch_logs(tmp, Path(args.keep) / f"{rate}-{backend}.logs", backend)
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def keep_launch_logs(tmp: Path, dest: Path, backend: str) -> None:
    """Copy the calibration's and the timed launch's files (periods, phases, every rank's unit
    logs, marks and gradient times) to ``dest``: the launches' raw data, for reading later."""
    dest.mkdir(parents=True, exist_ok=True)
    for pattern in (f"train-{backend}.json*", f"handoff-{backend}.json*"):
        for f in tmp.glob(pattern):
            if f.is_file():
                shutil.copy2(f, dest / f.name)


def _train(
    link: Link,
    backend: str,
    schedule: Path,
    tmp: Path,
    args: argparse.Namespace,
    *,
    again: dict[str, Path] | None = None,
    others: dict[str, Path] | None = None,
) -> dict[str, list[float]]:
    """The timed launch; ``again``: the calibration's schedules to train too, by variant
    (``again_schedules``); ``others``: other schedules of the replay's mode to train too, by
    variant (``NOJOIN_VARIANT``, ``NOHEDGE_VARIANT``)."""
    again = again or {}
    others = others or {}
    common = ["--role", "train", "--backend", backend, "--schedule", str(schedule)]
    common += ["--sync-schedule", str(schedule.with_suffix("").with_suffix(".sync.schedule.json"))]
    for variant, path in again.items():
        common += [f"--again-{'sync-' if variant in SYNC_VARIANTS else ''}schedule", str(path)]
    common += ["--batch", str(args.batch), "--blocks", str(args.blocks), "--steps", str(args.steps)]
    if args.horovod_env:
        common += ["--horovod-env", args.horovod_env]
    runtime = ["online", "pace", *(["pace-serial"] if args.compare_serial else []), "pace-sync"]
    runtime += list(again)
    for variant, path in others.items():
        common += [f"--{variant.removeprefix('pace-')}-schedule", str(path)]
        runtime.append(variant)
    if args.compare_path and backend == "horovod":
        from pace.io import load_schedule, save_schedule

        path_schedule = schedule.with_suffix("").with_suffix(".path.schedule.json")
        marked = dataclasses.replace(load_schedule(schedule), framework="horovod")
        save_schedule(marked, path_schedule)
        common += ["--path-schedule", str(path_schedule)]
        runtime.append(PATH_VARIANT)
    # One launch trains every variant, blocks alternating, so the ratios are taken under the
    # same load of the shared machine. `local` (no communication) is the launch's compute and
    # calibrates the `calibrated` predictions. With Horovod, vanilla and its `local@vanilla`
    # run under Horovod's defaults (fusion, cache: they idle differently), the rest under the
    # runtime's settings; the ranks re-initialise Horovod where the two alternate.
    variants = ["vanilla", *(["local@vanilla", "vanilla-nofusion"] if backend == "horovod" else [])]
    variants += [*runtime, "local", LOCAL_FREE]
    path = tmp / f"train-{backend}.json"
    clear_launch_outputs(path)
    _say(f"  training {', '.join(variants)} ...")
    env = pace_horovod_env() if backend == "horovod" else None
    launch(link, backend, [*common, "--variants", ",".join(variants), "--out", str(path)], env)
    out = read_launch(path)
    if "local" in out and LOCAL_FREE in out:
        stepped, free = (statistics.median(out[k]) * 1e3 for k in ("local", LOCAL_FREE))
        _say(
            f"    local: {stepped:.1f} ms with the ranks in step, {free:.1f} ms running free "
            f"({stepped / free - 1.0:+.1%}: the same layers at once)"
        )
    for kind, (fw, bw, st) in phase_medians_ms(Path(f"{path}.phases")).items():
        # The training thread's time per phase: in forward it also waits for updates (the
        # runtime's overlapped mode), in backward for reductions (DDP, sync modes).
        _say(f"    {kind}: forward {fw:.1f} ms, backward {bw:.1f} ms, step {st:.1f} ms")
    if (settings := Path(f"{path}.settings")).exists():
        for kind, env in json.loads(settings.read_text()).items():
            shown = ", ".join(f"{k}={v}" for k, v in env.items() if v is not None)
            _say(f"    {kind} ran under Horovod's {shown or 'defaults'}")
    return out


def clear_launch_outputs(path: Path) -> None:
    """Remove what an earlier launch wrote to ``path`` and beside it (``path.*``: phases, every
    rank's unit logs, marks). The rates' launches share one directory, and a variant that
    logs nothing in this launch (one trained through Horovod's own path logs no units) must
    not be reported with the rate before's logs."""
    for f in path.parent.glob(f"{path.name}*"):
        if f.is_file():
            f.unlink()


RANKS = 2


def read_launch(path: Path, ranks: int = RANKS) -> dict[str, list[float]]:
    """A training launch's periods (seconds per variant): rank 0's, each `local` run's taken per
    iteration from the slower rank (``slower_rank``), and said."""
    per_rank = [
        {
            k: [float(v) for v in vs]
            for k, vs in json.loads(Path(f"{path}.rank{r}").read_text()).items()
        }
        for r in range(ranks)
    ]
    out = per_rank[0] | slower_rank(per_rank)
    for k in out:
        if k.startswith("local"):
            rank0, slower = (statistics.median(p) * 1e3 for p in (per_rank[0][k], out[k]))
            _say(
                f"    {k}: rank 0 {rank0:.1f} ms, the slower rank per iteration {slower:.1f} ms "
                f"({slower / rank0 - 1.0:+.1%})"
            )
    return out


def read_cpu(path: Path, cores: int) -> dict[str, tuple[float, float]]:
    """Per variant of a training launch (``worker_train``'s ``.cpu`` file): the host's busy
    core-ms per iteration and the fraction of its ``cores`` busy, over the timed blocks."""
    out = {}
    for kind, blocks in json.loads(path.read_text()).items():
        busy_ms = sum(b for b, _, _ in blocks)
        wall_ms = sum(w for _, w, _ in blocks)
        iterations = sum(n for _, _, n in blocks)
        if iterations and wall_ms > 0:
            out[kind] = (busy_ms / iterations, busy_ms / (cores * wall_ms))
    return out


def read_threads(
    path: Path, host_core_ms: dict[str, float], ranks: int = RANKS
) -> dict[str, dict[str, float]]:
    """Per variant of a training launch: core-ms per iteration by thread class
    (``thread_cpu_ms``), summed over the ranks, and ``kernel``: the host's busy core-ms per
    iteration (``read_cpu``) less what the ranks' threads used (the kernel's interrupt and
    softirq work, the network path's, and anything else on the host). Where a communicating
    variant spends the cores beside `local`: which part of the program to make cheaper."""
    totals: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    for r in range(ranks):
        blocks_of = json.loads(Path(f"{path}.threads.rank{r}").read_text())
        for kind, blocks in blocks_of.items():
            into = totals.setdefault(kind, dict.fromkeys(THREAD_CLASSES, 0.0))
            for used, steps in blocks:
                for c in THREAD_CLASSES:
                    into[c] += used.get(c, 0.0)
                if r == 0:
                    counts[kind] = counts.get(kind, 0) + steps
    out = {}
    for kind, into in totals.items():
        n = counts.get(kind, 0)
        if n:
            per = {c: v / n for c, v in into.items()}
            if kind in host_core_ms:
                per["kernel"] = host_core_ms[kind] - sum(per.values())
            out[kind] = per
    return out


def lead_in_report(path: Path, median_ms: dict[str, float]) -> str:
    """Per variant, the median of the uncounted lead-in periods (``LEAD_IN``) against the
    counted median (``median_ms``): how far a block's first iteration is from the steady
    state."""
    lead = {k: statistics.median(v) * 1e3 for k, v in json.loads(path.read_text()).items() if v}
    parts = [f"{k} {ms:.0f} ({ms / median_ms[k] - 1.0:+.0%})" for k, ms in lead.items()]
    return "    a block's first iteration (not counted), against the median: " + ", ".join(parts)


def cpu_floor_ms(cores_busy: dict[str, float], median_ms: dict[str, float]) -> float | None:
    """The least ``cores_busy * median period`` over the variants that communicate (all but
    the `local` runs): the host CPU the cheapest of them needed per iteration, over the cores.

    Both ranks share the host: an iteration that needs ``W`` core-ms of the host (the two
    training threads, Horovod's or gloo's threads, the kernel's TCP, veth and tc work) takes
    at least ``W / cores``; a variant whose cores were busy a fraction ``u`` of its blocks
    needed about ``u * T`` of its period ``T`` that way. Moving the same bytes costs about the
    same CPU in any order, so a schedule that costs the cores no less than the cheapest
    measured one is no faster than this. A floor of the measured programs, not a theorem: a
    runtime that needed less CPU per byte or per call could go below it. Taken on the median
    periods, as the table's speed-ups are, it never exceeds the program it was measured on."""
    costs = [
        u * median_ms[kind]
        for kind, u in cores_busy.items()
        if not kind.startswith("local") and kind in median_ms
    ]
    return min(costs) if costs else None


def slower_rank(per_rank: Sequence[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Each `local` run's periods, per iteration the longest over the ranks.

    Rank 0 times every period. Where the ranks synchronise (every variant that communicates),
    an iteration waits for the slower one; in `local` they never do, so its rank-0 periods
    miss that wait. Measured at 2 Gbit/s with Horovod, the slower rank per iteration took
    2.7% longer than rank 0's median (4.1% in the mean), and with torch rank 1 was the faster
    in every iteration (294 against 311 ms): rank 0's own periods are the job's compute only
    where it happens to be the slower rank. Iteration ``i`` of a `local` block runs at about
    the same time on each rank: a block starts after one that synchronised the ranks, or
    after another `local` block. With independent noise on each rank, a job that
    synchronises every iteration pays the expected maximum too, not rank 0's median."""
    out: dict[str, list[float]] = {}
    for k in per_rank[0]:
        if not k.startswith("local"):
            continue
        series = [r[k] for r in per_rank]
        if len({len(s) for s in series}) != 1:
            raise ValueError(f"the ranks timed different numbers of `{k}` periods")
        out[k] = [max(p) for p in zip(*series, strict=True)]
    return out


def read_unit_logs(path: Path, ranks: int = RANKS) -> list[list[Any]] | None:
    """Every rank's ``UnitLog`` of one variant (``{path}.rank{r}``); None where the variant
    logged no units (rank 0 wrote none)."""
    if not Path(f"{path}.rank0").exists():
        return None
    return [json.loads(Path(f"{path}.rank{r}").read_text()) for r in range(ranks)]


def merged_units(per_rank: Sequence[Sequence[Sequence[float]]]) -> list[tuple[int, float]]:
    """Each unit's ``(bytes, us)``: how long the job held the channel for it, from when the
    last rank could start it (its issue there, or its previous unit's end there) to when the
    last rank saw it done.

    A rank's own log times a unit from that rank's issue, so where another rank issues it
    later it also holds the wait for that rank. The simulator replays one rank with the
    slower rank's compute (``slower_rank``), so that wait is not the channel's. In the
    calibration launches of one full run (commit 9b66406), rank 0's own log was longer than
    this per unit: with Horovod by 6.1-12.5 ms for the sync mode's units (its last units are
    issued as backward ends, which the two ranks reach at different times) and 2.0-5.4 ms
    for the replay's; with torch by 0.5-5.1 ms for both; and within 0.03 ms for the online
    mode's (its pieces go once every rank has said it is ready)."""
    return [(size, (end_s - start_s) * 1e6) for size, start_s, end_s in merged_spans(per_rank)]


def merged_spans(per_rank: Sequence[Sequence[Sequence[float]]]) -> list[tuple[int, float, float]]:
    """Each unit's ``(bytes, start_s, end_s)`` on the job's channel (``merged_units``): the
    latest start over the ranks and the latest time a rank saw it done."""
    if len({len(units) for units in per_rank}) != 1:
        raise ValueError("the ranks logged different numbers of units")
    out: list[tuple[int, float, float]] = []
    for units in zip(*per_rank, strict=True):
        sizes = {int(u[0]) for u in units}
        if len(sizes) != 1:
            raise ValueError(f"the ranks logged one unit with different sizes: {sorted(sizes)}")
        start_s = max(done_s - us / 1e6 for _, us, done_s in units)
        end_s = max(done_s for _, _, done_s in units)
        out.append((sizes.pop(), start_s, end_s))
    return out


def counted_iteration(it: int, per_block: int) -> bool:
    """Whether the idle split counts iteration ``it`` of blocks of ``per_block``: not a
    block's first (nothing before it) nor its last (drained)."""
    return 1 <= it % per_block <= per_block - 2


def measured_idle(
    per_rank: Sequence[Sequence[Sequence[float]]],
    marks: Sequence[Sequence[Sequence[float]]],
    per_block: int,
    grads: Sequence[Sequence[float]] | None = None,
) -> IdleSplit | None:
    """Where the job's channel idled in an iteration of an overlapped mode: the medians over
    the iterations that have one before them and one after them in their block (``IdleSplit``);
    None where no iteration qualifies.

    ``per_rank``: every rank's ``UnitLog.done``; ``marks``: every rank's ``UnitLog.marks``
    (blocks of ``per_block`` iterations). A unit belongs to the iteration whose backward
    issued it: every parameter is used in the forward, so the next forward ends only once
    the unit is done; on rank 0 it is done after that iteration's forward ended and before
    the next one's did. The channel runs one unit at a time (in order), so an iteration's
    units are its logged units in order, and the job's channel idles where the next one
    starts (``merged_spans``) after the last one ended.

    ``grads``: every rank's ``UnitLog.grads`` (sorted), which split the head
    (``IdleSplit.head_backward_ms``): a rank issues an iteration's first unit after the
    previous iteration's last unit was done there, so its own log's start of that unit is its
    issue."""
    if len({len(m) for m in marks}) != 1 or len(marks[0]) % per_block:
        raise ValueError(f"the ranks' marks are not whole blocks of {per_block} iterations")
    spans = merged_spans(per_rank)
    ends0 = [m[1] for m in marks[0]]
    forward_end = [max(m[i][1] for m in marks) for i in range(len(ends0))]
    of_iteration: dict[int, list[int]] = {}
    for i, (_, _, done_s) in enumerate(per_rank[0]):
        of_iteration.setdefault(bisect.bisect_left(ends0, done_s) - 1, []).append(i)
    tails, heads, withins = [], [], []
    split: list[tuple[float, float, float]] = []  # per iteration: backward, dispatch, skew
    counts: list[int] = []  # per iteration: gradients marked after the forward, before issue
    aheads: list[float] = []  # per iteration: the other rank's backward to as many gradients
    for it in range(len(ends0)):
        if not counted_iteration(it, per_block):
            continue
        before, units = of_iteration.get(it - 1), of_iteration.get(it)
        if not before or not units:
            continue
        tails.append(forward_end[it] - spans[before[-1]][2])
        heads.append(spans[units[0]][1] - forward_end[it])
        withins.append(
            sum(max(0.0, spans[b][1] - spans[a][2]) for a, b in itertools.pairwise(units))
        )
        if grads is not None:
            issued = [log[units[0]][2] - log[units[0]][1] / 1e6 for log in per_rank]
            last = max(range(len(issued)), key=issued.__getitem__)
            ready = grads[last][: bisect.bisect_right(grads[last], issued[last])]
            backward_end = ready[-1] if ready else marks[last][it][1]
            count = len(ready) - bisect.bisect_right(grads[last], marks[last][it][1])
            counts.append(count)
            for r in range(len(per_rank)):
                if r == last or count < 1:
                    continue
                after = bisect.bisect_right(grads[r], marks[r][it][1])
                if after + count <= len(grads[r]):
                    aheads.append(grads[r][after + count - 1] - marks[r][it][1])
            split.append(
                (
                    backward_end - marks[last][it][1],
                    issued[last] - backward_end,
                    issued[last] - min(issued),
                )
            )
    if not tails:
        return None
    parts = [statistics.median(x) * 1e3 for x in zip(*split, strict=True)] if split else []
    return IdleSplit(
        tail_ms=statistics.median(tails) * 1e3,
        head_ms=statistics.median(heads) * 1e3,
        within_ms=statistics.median(withins) * 1e3,
        head_backward_ms=parts[0] if parts else None,
        head_dispatch_ms=parts[1] if parts else None,
        head_skew_ms=parts[2] if parts else None,
        head_gradients=round(statistics.median(counts)) if counts else None,
        head_ahead_ms=statistics.median(aheads) * 1e3 if aheads else None,
    )


def local_ready_ms(
    marks: Sequence[Sequence[Sequence[float]]],
    grads: Sequence[Sequence[float]],
    per_block: int,
    count: int,
    *,
    slower: bool = True,
) -> list[float] | None:
    """How long `local`'s backward took to mark 1, 2, ... ``count`` gradients ready after its
    forward's end: per iteration and gradient the slower rank's (the channel waits for the
    later one; ``slower=False``: the faster rank's), the median over the iterations
    ``measured_idle`` counts; None where none had that many. ``marks``, ``grads`` (sorted):
    every rank's, as the runtime's monitor gives them (the worker logs `local`'s too)."""
    if count < 1:
        return None
    per_iteration = []
    for it in range(len(marks[0])):
        if not counted_iteration(it, per_block):
            continue
        took = []
        for m, g in zip(marks, grads, strict=True):
            first = bisect.bisect_right(g, m[it][1])
            if first + count > len(g) or g[first + count - 1] > m[it][2]:
                break  # fewer than ``count`` gradients before this backward's end
            took.append([t - m[it][1] for t in g[first : first + count]])
        else:
            pick = max if slower else min
            per_iteration.append([pick(ranks) for ranks in zip(*took, strict=True)])
    if not per_iteration:
        return None
    return [statistics.median(k) * 1e3 for k in zip(*per_iteration, strict=True)]


def local_backward_ms(
    marks: Sequence[Sequence[Sequence[float]]],
    grads: Sequence[Sequence[float]],
    per_block: int,
    count: int,
    *,
    slower: bool = True,
) -> float | None:
    """``local_ready_ms``'s last: `local`'s backward to ``count`` gradients."""
    ready = local_ready_ms(marks, grads, per_block, count, slower=slower)
    return ready[-1] if ready else None


def _idle_of(prefix: Path, per_block: int, local: Path | None = None) -> IdleSplit | None:
    """``measured_idle`` of a runtime variant's logs in a launch (``{prefix}.units.rank{r}``,
    ``{prefix}.marks.rank{r}``); None where it logged no units. With ``local`` (the prefix of
    the same launch's `local` logs), also `local`'s backward to as many gradients."""
    logs = read_unit_logs(Path(f"{prefix}.units"))
    if logs is None:
        return None
    marks, grads = _marks_and_grads(prefix, len(logs))
    idle = measured_idle(logs, marks, per_block, grads)
    if idle is None or idle.head_gradients is None or local is None:
        return idle
    if not Path(f"{local}.marks.rank0").exists():
        return idle
    local_logs = _marks_and_grads(local, len(logs))
    return dataclasses.replace(
        idle,
        head_local_ms=local_backward_ms(*local_logs, per_block, idle.head_gradients),
        head_local_ahead_ms=local_backward_ms(
            *local_logs, per_block, idle.head_gradients, slower=False
        ),
    )


def _marks_and_grads(prefix: Path, ranks: int) -> tuple[list[Any], list[list[float]]]:
    marks = [json.loads(Path(f"{prefix}.marks.rank{r}").read_text()) for r in range(ranks)]
    grads = [sorted(json.loads(Path(f"{prefix}.grads.rank{r}").read_text())) for r in range(ranks)]
    return marks, grads


def local_of(variant: str, backend: str, on_framework: frozenset[str] = frozenset()) -> str:
    """The `local` run under the Horovod settings that ``variant`` runs with (see ``_train``;
    ``on_framework``: the compiled modes whose schedule trains with Horovod's own path, under
    its defaults as vanilla)."""
    defaults = under_defaults(variant, on_framework)
    return "local@vanilla" if backend == "horovod" and defaults else "local"


def on_framework_modes(schedule: Any, sync_schedule: Any) -> frozenset[str]:
    """The compiled modes whose schedule is marked for the framework's own path."""
    return frozenset(
        k
        for k, compiled in (
            ("pace", schedule),
            ("pace-serial", schedule),
            ("pace-sync", sync_schedule),
        )
        if compiled is not None and compiled.framework is not None
    )


HANDOFF_STEPS = 6  # calibration iterations per block (after 2 of warm-up)
HANDOFF_BLOCKS = 3  # alternating: `local` is timed before and after the others
# Whose units' channel time the calibration fits: they run beside compute (the sync mode's
# last units run after backward, alone, as the cost model has them).
HANDOFF_VARIANTS = ("pace", "online")
RUNTIME_MODES_LOGGED = (*HANDOFF_VARIANTS, "pace-sync")  # the calibration launch's unit logs
# Per-call (ms) and per-MiB (ms) compute losses tried before the least-squares refinement:
# the period is not smooth in them (a loss moves ops past a unit's start), so a local search
# from the probe's values alone can stop on a step.
LOSS_GRID_MS = ((0.0, 1.0, 3.0, 10.0, 30.0), (0.0, 0.25, 0.5, 1.0, 2.0, 4.0))
LOSS_STARTS = 4  # of those, where the refinement starts from


@dataclass(frozen=True)
class Calibration:
    """What the calibration launch measured and fitted (``calibrate_handoff``): how each
    variant ran (``AsRun``) and the launch's periods (seconds, per variant)."""

    as_run: AsRun
    periods: dict[str, list[float]]
    # The replay's and the sync mode's schedules the launch trained (``calibrate_handoff``).
    schedules: tuple[Any, Any] | None = None
    # The link's cost model as the launch's units measured it (``_fit_channel``: the probe's,
    # its alpha lowered where the units took less); None: the probe's.
    comm: Any = None
    # The trace (with ``comm``) in the shape of the launch's `local` compute (``reshaped``),
    # what the compiler and the predictions take from this launch on; None: the profile's.
    trace: Any = None


def calibrate_handoff(
    link: Link,
    backend: str,
    trace: Any,
    *,
    terms: dict[str, Any],
    tmp: Path,
    args: argparse.Namespace,
) -> Calibration:
    """The probe's terms (``terms["*"]``, under the runtime's settings; with Horovod
    ``terms["vanilla"]``, under its defaults) refitted on a short training run, per variant
    the run trains (``fit_calibration``). The runtime's variants get the channel part (how
    long the runtime's units take beside compute, ``_fit_channel``) and the compute part
    (what compute loses beside the calls, ``fit_compute_loss``), so that the compiler and the
    predictions see what the runtime's units, not the probe's back-to-back calls, cost.

    The run trains the schedule ``terms["*"]`` compiles to, the online mode (its partitions of
    at most 4 MiB: sizes from a few KiB to tens of MiB, so per-call and per-byte parts are
    told apart), the sync mode (its backward runs beside the units, where the overlapped
    modes' forward mostly waits for them: on a fit to the overlapped modes alone the sync
    mode was under-predicted by 5-10%), vanilla (DDP's loss is fitted with the runtime's;
    with Horovod its fused calls' cost is fitted, which the probe's single calls under the
    runtime's settings do not measure: from the probe alone vanilla Horovod was
    under-predicted by 10-13% at 1 and 2 Gbit/s) and `local`
    (the job's compute with no communication, the measure of the others' periods and what the
    compiler is then given as the compute; with Horovod also `local@vanilla`, under Horovod's
    defaults, for vanilla's prediction).
    """
    from pace.compiler import compile_trace
    from pace.io import save_schedule

    comm = trace.comm
    term = terms["*"]
    probe_trace = dataclasses.replace(trace, comm=dataclasses.replace(comm, interference=term))
    first = compile_trace(probe_trace, baselines=False).schedule
    first_sync = compile_trace(probe_trace, mode="sync", baselines=False).schedule
    path = tmp / f"handoff-{backend}.schedule.json"
    sync_path = tmp / f"handoff-{backend}.sync.schedule.json"
    save_schedule(first, path)
    save_schedule(first_sync, sync_path)
    out = tmp / f"handoff-{backend}.json"
    clear_launch_outputs(out)
    timed = [*HANDOFF_VARIANTS, "pace-sync", "vanilla"]
    locals_ = ["local", *(["local@vanilla"] if backend == "horovod" else [])]
    argv = ["--role", "train", "--backend", backend, "--schedule", str(path)]
    argv += ["--sync-schedule", str(sync_path), "--batch", str(args.batch)]
    argv += ["--blocks", str(HANDOFF_BLOCKS), "--steps", str(HANDOFF_STEPS)]
    argv += ["--variants", ",".join([*timed, *locals_]), "--out", str(out)]
    launch(link, backend, argv, pace_horovod_env() if backend == "horovod" else None)
    comm, channel = _fit_channel(out, comm, term, units_per_iteration=len(first.units))
    trace = dataclasses.replace(trace, comm=comm)
    periods = read_launch(out)
    phases = phase_medians_ms(Path(f"{out}.phases"))
    steps_us = {k: p[2] * 1e3 for k, p in phases.items() if k in step_measured(backend)}
    forwards_over_us = forwards_over_local_us(phases, backend)
    in_job_step_ms = _local_ms(periods)["local"] / _compute_us(trace) * _step_us(trace)
    over = ", ".join(f"{k} {us / 1e3:+.1f} ms" for k, us in forwards_over_us.items())
    _say(
        "    the step on the training thread: "
        + ", ".join(f"{k} {us / 1e3:.1f} ms" for k, us in steps_us.items())
        + f" (the profile's, scaled to `local`: {in_job_step_ms:.1f} ms)"
        + (f"; the forward over `local`'s: {over}" if over else "")
    )
    base = AsRun(
        terms={"*": channel, "vanilla": terms.get("vanilla", term)},
        steps_us=steps_us,
        forwards_over_us=forwards_over_us,
    )
    shaped = job_shaped(trace, Path(f"{out}.local"), periods)
    fitted = fit_calibration(shaped, (first, first_sync), backend, base, periods)
    return dataclasses.replace(fitted, schedules=(first, first_sync), comm=comm, trace=shaped)


def job_shaped(trace: Any, local: Path, periods: dict[str, list[float]]) -> Any:
    """``trace`` in the shape of a launch's `local` compute (``reshaped``; ``local``: the
    prefix of its logs, ``periods``: the launch's), and said; unchanged, and said, where the
    logs do not hold every gradient of an iteration."""
    from pace.drift.estimate import trace_spans

    local_ms = _local_ms(periods)["local"]
    ready = (
        local_ready_ms(
            *_marks_and_grads(local, RANKS),
            iterations_per_block(HANDOFF_STEPS),
            len(trace.tensors),
        )
        if Path(f"{local}.grads.rank0").exists()
        else None
    )
    shaped = reshaped(trace, local_ms, ready) if ready else trace
    if shaped is trace:
        _say("    the backward's shape: the profile's (`local` did not log every gradient)")
        return trace
    was, now = (trace_spans(in_job(t, local_ms)) for t in (trace, shaped))
    ratios = [
        now.ready_us[n] / t
        for n, t in sorted(was.ready_us.items(), key=lambda kv: kv[1])
        if t > 0.02 * was.backward_us
    ]
    forward = now.forward_us / was.forward_us
    _say(
        "    the backward's shape in `local` (each gradient on the slower rank): ready at "
        f"x{min(ratios):.2f}-x{max(ratios):.2f} the profile's scaled to `local` (the first "
        f"past 2% of the backward x{ratios[0]:.2f}); the forward x{forward:.2f}"
    )
    return shaped


def repeat_ms(cal: Calibration, schedules: dict[str, Any]) -> dict[str, float]:
    """Per variant, the calibration launch's median period (ms) where the timed launch ran the
    same program: every variant it trained, except a runtime mode whose schedule (in
    ``schedules``, by variant) was compiled again to other units; such a mode compiled to
    Horovod's own path repeats the launch's `vanilla` (the same program); and the variants
    that train the calibration's schedules again (`pace@cal`, ``again_schedules``)."""
    trained = dict(zip(COMPILED_MODES, cal.schedules or (None, None), strict=True))
    out = {
        v: statistics.median(p) * 1e3
        for v, p in cal.periods.items()
        if v not in schedules or _program(trained[v]) == _program(schedules[v])
    }
    # A mode compiled to Horovod's own path trains vanilla's program (hvd.DistributedOptimizer
    # under Horovod's defaults, the same calls in the same order; only the runtime's wait
    # polls where vanilla's spins): the calibration launch measured it as `vanilla`.
    if "vanilla" in cal.periods:
        out |= {
            v: statistics.median(cal.periods["vanilla"]) * 1e3
            for v, compiled in schedules.items()
            if v not in out and compiled is not None and compiled.framework is not None
        }
    # The calibration's own schedules, wherever the timed launch trains them again.
    return out | {
        f"{v}{AGAIN}": statistics.median(cal.periods[v]) * 1e3
        for v in COMPILED_MODES
        if v in cal.periods and trained[v] is not None
    }


def again_schedules(cal: Calibration, compiled: dict[str, Any]) -> dict[str, Any]:
    """The calibration launch's schedules that the compiler then compiled to other units
    (``compiled``, by mode), by the variant that trains them again (`pace@cal`, ...): the
    timed launch trains them too, so a compiled mode has a repeat as well (``repeat_ms``)."""
    trained = dict(zip(COMPILED_MODES, cal.schedules or (None, None), strict=True))
    return {
        f"{v}{AGAIN}": trained[v]
        for v in COMPILED_MODES
        if trained[v] is not None and _program(trained[v]) != _program(compiled[v])
    }


def as_again(by_mode: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    """``by_mode``'s results of the compiled modes, under the names of the variants in
    ``again`` that trained the calibration's schedules again."""
    return {f"{v}{AGAIN}": by_mode[v] for v in COMPILED_MODES if f"{v}{AGAIN}" in again}


def of_programs(
    fn: Callable[[Any, Any], dict[str, Any]],
    schedules: tuple[Any, Any],
    cal: Calibration | None,
    again: dict[str, Any],
    others: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``fn``'s results (by variant) of ``schedules`` (the replay's and the sync mode's), of
    the calibration's under the names of the variants in ``again`` that train them again, and
    of ``others`` (variant: another schedule of the replay's mode, e.g. ``NOJOIN_VARIANT``'s)
    as `pace`'s result with that schedule."""
    out = fn(*schedules)
    if again and cal is not None and cal.schedules is not None:
        out |= as_again(fn(*cal.schedules), again)
    for variant, schedule in (others or {}).items():
        if (got := fn(schedule, schedules[1]).get("pace")) is not None:
            out[variant] = got
    return out


def _program(schedule: Any) -> Any:
    """What the runtime trains with of a schedule: its units' slices, in priority order, or
    the framework's own path where the schedule says so."""
    if schedule is None:
        return None
    return (schedule.framework, tuple(u.slices for u in schedule.ordered_units()))


def framework_path(backend: str, as_run: AsRun) -> Any:
    """Vanilla Horovod's path as the calibration launch measured it (``fit_vanilla_channel``:
    its fused, cached calls' cost; its compute term), for the compiler to weigh against its
    schedule (``comm.framework``); None with torch (DDP's buckets are among the compiler's
    own baselines, under the runtime's cost terms, which DDP's calls share)."""
    from pace.ir import FrameworkPath

    comm = as_run.comms.get("vanilla")
    if backend != "horovod" or comm is None:
        return None
    term = as_run.term("vanilla")
    return FrameworkPath(
        backend="horovod",
        alpha_us=comm.alpha_us,
        beta_us_per_byte=comm.beta_us_per_byte,
        interference=dataclasses.replace(term, idle_loss=0.0) if term is not None else None,
    )


def _say_framework(mode: str, result: CompileResult) -> None:
    """The compiler's choice between the schedule's units and Horovod's own path, with both
    predictions, so a run shows the margin the choice was made on."""
    if result.framework_us is None:
        return
    units_ms = result.schedule.predicted_iteration_us / 1e3
    path_ms = result.framework_us / 1e3
    if result.schedule.framework is None:
        _say(
            f"    {mode}: the units kept: predicted {units_ms:.1f} ms against Horovod's own "
            f"path's {path_ms:.1f} ms"
        )
    else:
        margin = result.schedule.meta["framework"]["margin"]
        _say(
            f"    {mode}: the compiler chose Horovod's own path: predicted {path_ms:.1f} ms "
            f"against the units' {units_ms:.1f} ms (units must be {margin:.0%} faster)"
        )


def step_measured(backend: str) -> frozenset[str]:
    """The variants whose `step` phase is the optimizer step alone, so a launch measures it:
    their backward returns with every gradient reduced (the sync mode; DDP). Vanilla Horovod's
    also waits for its reductions (``synchronize()``); the overlapped modes update in the
    background. In every pair of the df9ce08 run the sync mode's step took 17.8-23.0 ms and
    DDP's 18.7-21.4 ms against `local`'s 14.7-16.5 ms, which the profile's step misses."""
    return frozenset({"pace-sync", *(["vanilla"] if backend == "torch" else [])})


def forward_measured(backend: str) -> frozenset[str]:
    """The variants whose forward a launch measures for the prediction: the sync mode with
    Horovod. Every unit is done before its forward starts, yet rank 0's forward took 0-33 ms
    (mean 19) more than `local`'s in three full runs, and 5-32 ms (mean 19) in seven launches
    of ``bench_sync_forward.py --rate 1gbit``, where Horovod's threads (gloo's TCP loop, the
    background loop) and the training thread itself used more CPU for the same work than
    beside `local`'s forward. With torch it was within 7 ms of `local`'s; the overlapped
    modes' forward waits for units, which the replay models."""
    return frozenset({"pace-sync"} if backend == "horovod" else ())


def forwards_over_local_us(phases: dict[str, tuple[float, ...]], backend: str) -> dict[str, float]:
    """From a launch's phase medians (``phase_medians_ms``): how much longer than `local`'s
    each ``forward_measured`` variant's forward took, in us (negative where it was shorter:
    the launch's spread, kept so that the correction is not biased upward)."""
    if "local" not in phases:
        return {}
    local_ms = phases["local"][0]
    return {k: (p[0] - local_ms) * 1e3 for k, p in phases.items() if k in forward_measured(backend)}


def phase_medians_ms(path: Path) -> dict[str, tuple[float, ...]]:
    """Per variant, the median forward, backward and step phase (ms) of a launch's rank 0."""
    return {
        kind: tuple(statistics.median(r[i] for r in rows) * 1e3 for i in range(3))
        for kind, rows in json.loads(path.read_text()).items()
    }


def fit_calibration(
    trace: Any,
    schedules: tuple[Any, Any],
    backend: str,
    as_run: AsRun,
    periods: dict[str, list[float]],
) -> Calibration:
    """The calibration launch's fits, from its periods (seconds, per variant) and what it
    measured of its variants (``as_run``: the terms ``"*"``, the runtime's with the fitted
    channel part, and ``"vanilla"``, vanilla's probe; the measured steps).

    With torch every trained variant shares one compute loss (``fit_compute_loss``): DDP's
    buckets are reduced during backward, beside compute, as the runtime's units are. With
    Horovod, vanilla is left out of that fit and its compute loses nothing beside its calls:
    its backward took what `local@vanilla`'s did in every launch measured (within -23 to +20
    ms of 233-283 ms), and it computes nothing else while they run (``synchronize()`` waits
    for them before the step). So its miss is the wait for its fused calls after backward.
    A shared loss slowed its compute instead and over-predicted the runtime's variants by up
    to 8.5% while still under-predicting vanilla; its probe's loss (one size at a time,
    back to back) ranged over 0-4.2 ms per MiB between launches minutes apart. Its calls' cost
    is fitted instead (``fit_vanilla_channel``); its probe's channel part stays.
    """

    def per_variant(runtime: Any, vanilla: Any) -> AsRun:
        return dataclasses.replace(
            as_run, terms={**dict.fromkeys(RUNTIME_VARIANTS, runtime), "vanilla": vanilla}
        )

    if backend != "horovod":
        fitted = fit_compute_loss(trace, schedules, backend, as_run, periods)
        return Calibration(per_variant(fitted.term("*"), fitted.term("vanilla")), periods)
    shared = {k: v for k, v in periods.items() if k not in DEFAULT_SETTINGS_VARIANTS}
    runtime = dataclasses.replace(as_run, terms={"*": as_run.terms["*"]})
    fitted = fit_compute_loss(trace, schedules, backend, runtime, shared)
    no_loss = dataclasses.replace(as_run.terms["vanilla"], us_per_call=0.0, us_per_byte=0.0)
    by_variant = per_variant(fitted.term("*"), no_loss)
    vanilla = fit_vanilla_channel(trace, schedules, backend, by_variant, periods)
    return Calibration(dataclasses.replace(by_variant, comms={"vanilla": vanilla}), periods)


VANILLA_SCALES = (0.25, 4.0)  # the search range of vanilla's per-byte cost, times the probe's


def fit_vanilla_channel(
    trace: Any,
    schedules: tuple[Any, Any],
    backend: str,
    as_run: AsRun,
    periods: dict[str, list[float]],
) -> Any:
    """Vanilla's calls as the launch ran them: ``trace.comm`` with its per-byte cost scaled so
    that the simulator's vanilla period, with compute scaled to `local@vanilla`
    (``launch_calibrated_ms``), is the measured one.

    The probe times one tensor per call under the runtime's settings (fusion and cache off).
    Vanilla Horovod fuses: the simulator's cycle fusion charges its fused calls ``alpha + beta
    * bytes``, fewer alphas than vanilla-nofusion's, yet in every run the two took the same
    time within their spread (0.97-1.02x). Per byte is the part that decides a fused call, so
    that is the one number fitted. The period rises with it, so a root search (Brent) finds
    it; where the range's ends do not bracket the measurement, the nearer end is kept and
    said."""
    from scipy.optimize import brentq

    wanted = {k: periods[k] for k in ("vanilla", "local@vanilla")}
    measured_ms = statistics.median(periods["vanilla"]) * 1e3

    def scaled(scale: float) -> Any:
        return dataclasses.replace(trace.comm, beta_us_per_byte=trace.comm.beta_us_per_byte * scale)

    def miss(scale: float) -> float:
        pred = launch_calibrated_ms(
            trace,
            *schedules,
            backend,
            as_run=dataclasses.replace(as_run, comms={"vanilla": scaled(scale)}),
            measured=wanted,
        )
        return pred["vanilla"] / measured_ms - 1.0

    lo, hi = VANILLA_SCALES
    ends = (miss(lo), miss(hi))
    if ends[0] < 0.0 < ends[1]:
        scale = float(brentq(miss, lo, hi, xtol=1e-4))
        said = ""
    else:
        scale = lo if abs(ends[0]) < abs(ends[1]) else hi
        said = f" (the end of the range {lo}-{hi}: no scale in it matches)"
    _say(
        f"    vanilla's fused calls ({measured_ms:.0f} ms against `local@vanilla`): the probe's "
        f"cost misses by {miss(1.0):+.1%}; per byte x{scale:.3f}{said} "
        f"(+{(scale - 1.0) * trace.comm.beta_us_per_byte * 2**20 / 1e3:.3f} ms per MiB): "
        f"{miss(scale):+.1%}"
    )
    return scaled(scale)


def probe_loss(compiled: Any, probe: Any) -> Any:
    """``compiled`` with the probe's compute loss (``probe``'s per call and per byte) in place
    of the calibration's fit; everything else (the fitted channel part) kept: the other model
    the compiler hedges over."""
    term = dataclasses.replace(
        compiled.comm.interference, us_per_call=probe.us_per_call, us_per_byte=probe.us_per_byte
    )
    return dataclasses.replace(compiled, comm=dataclasses.replace(compiled.comm, interference=term))


# The compute speed-up the compiler also compiles for (``compile_trace(compute_hedge=...)``):
# the timed launch computes at another speed than the calibration launch minutes before, by
# -35% to +23% in `local` over the last runs (docs/results.md), and where compute hides the
# channel the compiler's pick among tied schedules could be one a faster compute exposes (1
# Gbit/s with Horovod: 734.4 ms at the launch's compute against 686.5 for a schedule as fast on
# the calibration's).
HEDGE_COMPUTE = (1.25,)


def _say_compute_hedge(mode: str, schedule: Any) -> None:
    """What the compute hedge chose: the pipeline's schedule, or the one compiled for a faster
    compute, each replayed on the calibration's compute and at the hedged speed."""
    info = schedule.meta.get("compute_hedge")
    if info is None:
        return
    rows = "; ".join(
        info["candidates"][i]
        + f": {nominal / 1e3:.1f} ms, "
        + ", ".join(f"x{s:g} {us / 1e3:.1f}" for s, us in zip(info["speedups"], row, strict=True))
        for i, (nominal, row) in enumerate(zip(info["nominal_us"], info["replays_us"], strict=True))
    )
    shipped = info["candidates"][info["chosen"]]
    _say(
        f"    {mode}: hedged over compute x{', x'.join(f'{s:g}' for s in info['speedups'])}, "
        f"shipped {shipped} ({len(schedule.units)} units); {rows}"
    )


def _say_hedge(mode: str, schedule: Any) -> None:
    """What the hedge chose: each candidate's replays (calibrated loss, probe's) and regret."""
    info = schedule.meta.get("hedge")
    if info is None:
        return
    names = ("calibrated loss", "probe's loss")
    labels = [
        f"the {names[m]}" + (", order searched" if searched else "")
        for m, searched in zip(info["compiled_under"], info["order_searched"], strict=True)
    ]
    cands = "; ".join(
        f"compiled under {labels[i]}: "
        + ", ".join(f"{us / 1e3:.1f}" for us in row)
        + f" ms (worst regret {info['regret'][i]:.1%})"
        for i, row in enumerate(info["replays_us"])
    )
    last = max(schedule.units, key=lambda u: u.priority)
    copy_ms = schedule.cost_model.copy_us_per_byte * last.size_bytes / 1e3 if last.fused else 0.0
    _say(
        f"    {mode}: hedged over the calibrated and the probe's loss, shipped the one compiled "
        f"under {labels[info['chosen']]} ({len(schedule.units)} units, the last "
        f"{last.size_bytes / 2**20:.2f} MiB, copied back in {copy_ms:.1f} ms); {cands}"
    )


def _fit_channel(out: Path, comm: Any, term: Any, *, units_per_iteration: int) -> tuple[Any, Any]:
    """``comm`` and ``term`` with the runtime's channel time beside compute: each unit's
    channel time (every rank's log lined up, ``merged_units``) beyond the cost model, fitted as
    ``c0 + c1 * bytes`` over the replay's and the online mode's units (each mode weighing alike
    in the least squares, however many units it has), expressed as the term's per-call delay
    and stretch (a call beside compute takes ``(1 + stretch) * cost + comm_us_per_call``, so
    ``stretch = c1 / beta``) and, where the units took less than the probe's alpha allows,
    ``comm``'s alpha lowered (``split_intercept``)."""
    import numpy as np
    from scipy.optimize import lsq_linear

    # Both size ranges: on the replay's few large units alone (4 per iteration at 0.5 Gbit/s)
    # the fit put a 20 ms delay on every call, which the online mode's many small ones then
    # did not pay (predicted +35%).
    # Each mode's units read once: the fit takes HANDOFF_VARIANTS', the report every mode's.
    logs = {v: read_unit_logs(Path(f"{out}.{v}.units")) for v in RUNTIME_MODES_LOGGED}
    if missing := [v for v, log in logs.items() if log is None]:
        raise ValueError(f"{out}: no unit logs of {', '.join(missing)}")
    per_rank = {v: log for v, log in logs.items() if log is not None}
    units = {v: merged_units(log) for v, log in per_rank.items()}
    extras = {v: _beyond_cost_us(d, comm) for v, d in units.items()}
    done = [u for v in HANDOFF_VARIANTS for u in units[v]]
    extra_us = np.array([e for v in HANDOFF_VARIANTS for e in extras[v]])
    size = np.array([b for b, _ in done], dtype=float)
    scale = float(size.max())
    # Each mode weighs alike, not each unit: the online mode's many small units outvoted the
    # replay's few large ones, whose cost beyond the model the fit then put at 4.29 ms against
    # the 6.76 ms they took (0.5 Gbit/s with Horovod, 2026-11-25).
    weight = np.concatenate(
        [np.full(len(units[v]), max(1, len(units[v])) ** -0.5) for v in HANDOFF_VARIANTS]
    )
    design = np.column_stack([np.ones_like(size), size / scale]) * weight[:, None]
    # The intercept may be negative, down to -alpha: units faster than the probe's cost model
    # (its small calls once took 8-17 ms at 1 Gbit/s with Horovod, 0.5-4.1 ms in 17 other
    # probes; the launch's units then ran a median 5.3 ms below it, which a fit held at >= 0
    # dropped).
    fit = lsq_linear(design, extra_us * weight, bounds=([-comm.alpha_us, 0.0], np.inf))
    c0, c1_scaled = (float(x) for x in fit.x)
    stretch = c1_scaled / scale / comm.beta_us_per_byte
    per_call, alpha_us = split_intercept(c0, stretch, comm.alpha_us)
    corrected = (
        f"; alpha {comm.alpha_us / 1e3:.2f} -> {alpha_us / 1e3:.2f} ms (the probe's was above "
        "what the units took)"
        if alpha_us < comm.alpha_us
        else ""
    )
    _say(
        f"    runtime units beside compute (the replay's {units_per_iteration} per iteration "
        f"and the online mode's, {len(done)} timed, each mode weighing alike): beyond the cost "
        "model, median "
        f"{statistics.median(extra_us) / 1e3:.2f} ms; "
        f"fit {c0 / 1e3:.2f} ms per unit + {c1_scaled / scale * 2**20 / 1e3:.3f} ms per MiB: "
        f"per-call delay {per_call / 1e3:.2f} ms, stretch {stretch:.3f} (the probe's: "
        f"{term.comm_us_per_call / 1e3:.2f} ms, {term.comm_stretch:.3f}){corrected}"
    )
    # Per variant, the fit against its own units; the sync mode's are not fitted (see
    # HANDOFF_VARIANTS), and this says how far its units are from the fit.
    for variant, d in units.items():
        if d:
            e = extras[variant]
            mib = statistics.fmean(b for b, _ in d) / 2**20
            fit_ms = (c0 + c1_scaled / scale * mib * 2**20) / 1e3
            own = _beyond_cost_us([(b, us) for b, us, _ in per_rank[variant][0]], comm)
            _say(
                f"      {variant}: {mib:.2f} MiB per unit, beyond the cost model "
                f"{statistics.fmean(e) / 1e3:.2f} ms per unit (in rank 0's own log "
                f"{statistics.fmean(own) / 1e3:.2f} ms), the fit {fit_ms:.2f} ms"
            )
    return dataclasses.replace(comm, alpha_us=alpha_us), dataclasses.replace(
        term, comm_us_per_call=per_call, comm_stretch=stretch
    )


def split_intercept(c0_us: float, stretch: float, alpha_us: float) -> tuple[float, float]:
    """The runtime's units' time beyond the probe's cost, ``c0 + stretch * beta * bytes``
    (``c0 >= -alpha``), as the per-call delay and the per-call cost ``alpha'`` of a call
    beside compute taking ``(1 + stretch) * (alpha' + beta * bytes) + delay``: the delay where
    ``c0`` covers the stretch of the probe's alpha, else no delay and a lower alpha (the
    probe's small calls were slower than the units; the units ran beside compute, so this
    alpha is still no less than theirs alone)."""
    if c0_us >= stretch * alpha_us:
        return c0_us - stretch * alpha_us, alpha_us
    return 0.0, max(0.0, (alpha_us + c0_us) / (1.0 + stretch))


def fit_compute_loss(
    trace: Any,
    schedules: tuple[Any, Any],
    backend: str,
    as_run: AsRun,
    periods: dict[str, list[float]],
) -> AsRun:
    """``as_run`` with each of its terms (per variant, ``"*"`` for the rest) given the one
    compute loss per call and per byte that makes the simulator's
    periods of ``schedules`` (the replay's and the sync mode's), with compute scaled to the
    run's `local` (``launch_calibrated_ms``), match the run's measured ones (least squares on
    relative errors, from the best few points of a coarse grid). The probe measures the loss
    beside back-to-back calls of one size; beside the runtime's units the training thread also
    shares the interpreter and the cores with the runtime's threads, which the probe never runs
    (at 1 and 2 Gbit/s the periods were longer than predicted by more than the channel times
    were)."""
    import numpy as np
    from scipy.optimize import least_squares

    fitted = [v for v in periods if not v.startswith("local")]
    measured_ms = np.array([statistics.median(periods[v]) * 1e3 for v in fitted])

    def with_loss(x: Sequence[float]) -> AsRun:
        loss = {"us_per_call": float(x[0]) * 1e3, "us_per_byte": float(x[1]) * 1e3 / 2**20}
        terms = {k: dataclasses.replace(t, **loss) for k, t in as_run.terms.items()}
        return dataclasses.replace(as_run, terms=terms)

    def misses(run: AsRun) -> Any:
        pred = launch_calibrated_ms(trace, *schedules, backend, as_run=run, measured=periods)
        return np.array([pred[v] for v in fitted]) / measured_ms - 1.0

    def residuals(x: Sequence[float]) -> Any:
        return misses(with_loss(x))

    def sse(x: Sequence[float]) -> float:
        return float(np.sum(residuals(x) ** 2))

    start = as_run.terms["*"]
    probe = (start.us_per_call / 1e3, start.us_per_byte * 2**20 / 1e3)
    grid = sorted([probe, *itertools.product(*LOSS_GRID_MS)], key=sse)
    # From the best few grid points: where a variant's loss saturates (MAX_COMPUTE_LOSS), the
    # sum of squares has flat valleys that a single start can settle in.
    best = min(
        (
            least_squares(residuals, start, bounds=(0.0, np.inf), diff_step=0.05)
            for start in grid[:LOSS_STARTS]
        ),
        key=lambda r: float(np.sum(r.fun**2)),
    )
    before, after = misses(as_run), best.fun
    _say(
        f"    compute beside the units ({', '.join(fitted)} against `local`, "
        f"{statistics.median(periods['local']) * 1e3:.0f} ms): the probes' loss "
        f"({probe[0]:.2f} ms per call + {probe[1]:.3f} ms per MiB under the runtime's "
        "settings) misses by "
        + ", ".join(f"{r:+.1%}" for r in before)
        + f"; fit {best.x[0]:.2f} ms per call + {best.x[1]:.3f} ms per MiB: "
        + ", ".join(f"{r:+.1%}" for r in after)
    )
    return with_loss(best.x)


def _beyond_cost_us(done: Sequence[tuple[int, float]], comm: Any) -> list[float]:
    """Each unit's time (``(bytes, us)``) beyond the cost model."""
    return [us - comm.cost_us(b) for b, us in done]


def _channel_per_iteration_ms(path: Path, iterations: int) -> float | None:
    """A runtime variant's units' channel time per measured iteration (its units' logs)."""
    logs = read_unit_logs(path)
    if logs is None:
        return None
    return float(sum(us for _, us in merged_units(logs))) / 1e3 / iterations


def _report_units(path: Path, comm: Any, schedule: Any) -> None:
    """What the runtime's units held the channel for, against the cost model."""
    logs = read_unit_logs(path)
    if logs is None:
        return
    done = merged_units(logs)
    extra = _beyond_cost_us(done, comm)
    per_iter = len(schedule.units)
    _say(
        f"    pace units: {len(done)} ({per_iter} per iteration); channel time minus the model's "
        f"cost, per unit: median {statistics.median(extra) / 1e3:.2f} ms, mean "
        f"{statistics.fmean(extra) / 1e3:.2f} ms; per iteration "
        f"{statistics.fmean(extra) * per_iter / 1e3:.1f} ms"
    )


def median_ci_ms(periods: Sequence[float]) -> tuple[float, float] | None:
    """95% confidence interval of the median period (s -> ms), by a percentile bootstrap
    (seeded: the same periods give the same interval); None for fewer than 3 periods."""
    import numpy as np
    from scipy.stats import bootstrap

    if len(periods) < 3:
        return None
    res = bootstrap(
        (np.asarray(periods, dtype=float) * 1e3,),
        np.median,
        confidence_level=0.95,
        method="percentile",
        n_resamples=4000,
        random_state=0,
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def within_noise(pred: float | None, r: Row) -> bool:
    """Is ``pred`` within 5% of the measured median, or inside its 95% interval?"""
    if pred is None:
        return False
    if abs(pred - r.measured_ms) <= 0.05 * r.measured_ms:
        return True
    return r.median_ci_ms is not None and r.median_ci_ms[0] <= pred <= r.median_ci_ms[1]


# Why a prediction misses its measurement, as far as the run itself measured it (``error_cause``).
CAUSES = ("within 5%", "the run's noise", "compute drift", "launch drift", "the model")


def error_cause(r: Row) -> str | None:
    """The first of ``CAUSES`` that accounts for ``r``'s prediction error (None: nothing
    predicted), each from what the runs measured:

    - ``within 5%``: no miss to explain;
    - ``the run's noise``: the prediction lies inside the measured median's 95% CI: the run
      cannot place its own median nearer;
    - ``compute drift``: the same replay with the compute this launch's own `local` measured
      (``calibrated_ms``) is within 5% or inside the CI: the miss is the host computing at
      another speed in this launch than in the calibration launch minutes before, which the
      prediction could not know (a `local` row's miss is that drift by definition);
    - ``launch drift``: the calibration launch's median of the same program (``repeat_ms``)
      is at least as far from this launch's as the prediction (the measurement itself moved
      that much between two launches), or the prediction is within 5% of it (the replay puts
      the program where the launch it was calibrated on measured it, and this launch measured
      it elsewhere: 5% as for the other causes; before, a prediction 0.2 ms nearer to this
      launch than the repeat was left to the model, 2026-11-27);
    - ``the model``: none of these: the replay's model of this variant is what to fix.
    """
    if r.predicted_ms is None:
        return None
    if abs(r.predicted_ms - r.measured_ms) <= 0.05 * r.measured_ms:
        return CAUSES[0]
    if within_noise(r.predicted_ms, r):
        return CAUSES[1]
    if within_noise(r.calibrated_ms, r) or r.variant.startswith("local"):
        # `local` measures the compute drift: its own miss is that drift.
        return CAUSES[2]
    if r.repeat_ms is not None and (
        abs(r.repeat_ms - r.measured_ms) >= abs(r.predicted_ms - r.measured_ms)
        or abs(r.predicted_ms - r.repeat_ms) <= 0.05 * r.repeat_ms
    ):
        return CAUSES[3]
    return CAUSES[4]


def cause_summary(rows: Sequence[Row]) -> str:
    """How many predictions (rows other than `local`) each of ``CAUSES`` accounts for, naming
    the rows left to the model."""
    scored = [(r, c) for r in rows if not r.variant.startswith("local") and (c := error_cause(r))]
    counts = collections.Counter(c for _, c in scored)
    parts = [f"{counts[c]} {c}" for c in CAUSES if counts[c]]
    model = [f"{r.rate} {r.backend} {r.variant}" for r, c in scored if c == CAUSES[-1]]
    return (
        f"the predictions' misses, of {len(scored)}: "
        + ", ".join(parts)
        + (f" ({'; '.join(model)})" if model else "")
    )


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _pct(pred: float | None, measured: float) -> str:
    return "-" if pred is None else f"{100 * (pred - measured) / measured:+.1f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _print_rows(rows: Sequence[Row], *, markdown: bool = False) -> None:
    base = {(r.rate, r.backend): r for r in rows if r.variant == "vanilla"}
    head = ["rate", "backend", "variant", "measured ms", "IQR ms", "95% CI ms", "speed-up"]
    head += ["predicted ms", "error", "pred. speed-up", "calibrated ms", "error"]
    head += ["repeat ms", "error"]
    head += ["independent ms", "error", "miss explained by"]
    lines = []
    for r in rows:
        v = base.get((r.rate, r.backend))
        speed = pspeed = "-"
        if v is not None and r.variant != "vanilla" and not r.variant.startswith("local"):
            speed = f"{v.measured_ms / r.measured_ms:.3f}x"
            if v.predicted_ms and r.predicted_ms:
                pspeed = f"{v.predicted_ms / r.predicted_ms:.3f}x"
        ci = f"{r.median_ci_ms[0]:.0f}-{r.median_ci_ms[1]:.0f}" if r.median_ci_ms else "-"
        cells = [r.rate, r.backend, r.variant, _ms(r.measured_ms), _ms(r.spread_ms), ci, speed]
        cells += [_ms(r.predicted_ms), _pct(r.predicted_ms, r.measured_ms), pspeed]
        cells += [_ms(r.calibrated_ms), _pct(r.calibrated_ms, r.measured_ms)]
        cells += [_ms(r.repeat_ms), _pct(r.repeat_ms, r.measured_ms)]
        cells += [_ms(r.independent_ms), _pct(r.independent_ms, r.measured_ms)]
        cells += [error_cause(r) or "-"]
        lines.append(cells)
    _print_table(head, lines, markdown=markdown)
    ours = [r for r in rows if not r.variant.endswith(AGAIN)]
    print("; ".join(_error_summary(ours)) + " (rows other than local)")
    print(cause_summary(ours))
    if again := [r for r in rows if r.variant.endswith(AGAIN)]:
        print(
            "the calibration's schedules trained again (not counted above): "
            + "; ".join(_error_summary(again))
        )
    agree, against, close, alike = ranking_agreement(ours)
    print(
        f"ranking: of {len(agree) + len(against)} pairs of variants (same rate and backend) "
        "measured further apart than half the larger IQR, the prediction orders "
        f"{len(agree)} the same way"
        + (f" and these the other way: {', '.join(against)}" if against else "")
        + f"; {close} pairs within the spread"
        + (
            f"; predicted alike (the same program) and measured apart: {', '.join(alike)}"
            if alike
            else ""
        )
    )


def _error_summary(rows: Sequence[Row]) -> list[str]:
    """Per kind of prediction (and the repeat), its errors over ``rows`` other than `local`."""
    summary = []
    for name in ("predicted", "calibrated", "repeat", "independent"):
        scored = [
            (r, x)
            for r in rows
            if (x := getattr(r, f"{name}_ms")) is not None and not r.variant.startswith("local")
        ]
        errs = [abs(x - r.measured_ms) / r.measured_ms for r, x in scored]
        if errs:
            within = sum(e <= 0.05 for e in errs)
            noise = sum(within_noise(x, r) for r, x in scored)
            summary.append(
                f"{name}: mean |error| {statistics.fmean(errs):.1%}, median "
                f"{statistics.median(errs):.1%}, {within} of {len(errs)} within 5%, "
                f"{noise} within 5% or the median's 95% CI"
            )
    return summary


def ranking_agreement(rows: Sequence[Row]) -> tuple[list[str], list[str], int, list[str]]:
    """Does the simulator rank the variants as the link did? Per rate and backend, every pair of
    variants whose measured periods differ by more than half the larger IQR (closer than that,
    the run cannot tell them apart) is ordered by the prediction the same way or not. Returns
    the agreeing and disagreeing pairs (named), how many pairs were within the spread, and the
    pairs measured apart that the prediction puts at the same time: the same program (a
    compiled mode the compiler sent to Horovod's own path trains as vanilla does and is
    predicted as vanilla), which no prediction can order; they were counted against before
    (2026-11-27: pace 969.5 and vanilla 914.7 ms, both Horovod's path, at 1 Gbit/s, and at
    2 Gbit/s pace 852.3 against vanilla's 913.1: the same program apart both ways)."""
    agree: list[str] = []
    against: list[str] = []
    alike: list[str] = []
    close = 0
    ranked = [r for r in rows if r.predicted_ms is not None and not r.variant.startswith("local")]
    for a, b in itertools.combinations(ranked, 2):
        if (a.rate, a.backend) != (b.rate, b.backend):
            continue
        assert a.predicted_ms is not None
        assert b.predicted_ms is not None
        measured = a.measured_ms - b.measured_ms
        if abs(measured) <= max(a.spread_ms, b.spread_ms) / 2:
            close += 1
            continue
        name = f"{a.rate} {a.backend} {a.variant}/{b.variant}"
        predicted = a.predicted_ms - b.predicted_ms
        if predicted == 0.0:
            alike.append(name)
            continue
        (agree if measured * predicted > 0 else against).append(name)
    return agree, against, close, alike


def _print_table(head: Sequence[str], lines: Sequence[Sequence[str]], *, markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for ln in lines:
            print("| " + " | ".join(ln) + " |")
        return
    widths = [max(len(h), *(len(ln[i]) for ln in lines)) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    for ln in lines:
        print("  ".join(c.ljust(w) for c, w in zip(ln, widths, strict=True)))
    sys.stdout.flush()


# The goal (the issue this benchmark answers): where vanilla's communication is exposed by
# GOAL_EXPOSED or more, pace at GOAL_SPEEDUP over it; everywhere, never slower than vanilla
# beyond the measured spread.
GOAL_EXPOSED = 0.15
GOAL_SPEEDUP = 1.15


def against_vanilla(vanilla: Row, pace: Row) -> str:
    """``faster``, ``slower`` or ``within the spread``: whether the two medians' 95% CIs are
    apart (``within the spread`` where either has none)."""
    if vanilla.median_ci_ms is None or pace.median_ci_ms is None:
        return "within the spread"
    if pace.median_ci_ms[1] < vanilla.median_ci_ms[0]:
        return "faster"
    if pace.median_ci_ms[0] > vanilla.median_ci_ms[1]:
        return "slower"
    return "within the spread"


def goal_verdict(exposed: float, speedup: float, most: float | None) -> str:
    """The speed-up goal for one rate and backend: ``n/a`` where vanilla's communication is
    exposed by less than ``GOAL_EXPOSED``; else ``met``, or why not: ``out of reach`` where
    the most any schedule could gain (``most``, vanilla over the bound) is below the goal,
    ``not met`` otherwise. A bound that pace measured below bounds nothing (the launch's
    `local`, which scales it, ran slower than pace's own compute: 2 Gbit/s with DDP,
    2026-11-28, pace 744.7 ms against a bound of 796.8): then the goal is ``not met``, not out
    of reach."""
    if exposed < GOAL_EXPOSED:
        return "n/a"
    if speedup >= GOAL_SPEEDUP:
        return "met"
    if most is not None and speedup <= most < GOAL_SPEEDUP:
        return "out of reach"
    return "not met"


def _print_goal(rows: Sequence[Row], *, markdown: bool = False) -> None:
    """Per rate and backend: how exposed vanilla's communication is, pace's speed-up over it,
    the most any schedule could gain (vanilla measured / the bound), and the goal's verdicts
    (``against_vanilla``, ``goal_verdict``)."""
    by = {(r.rate, r.backend, r.variant): r for r in rows}
    head = ["rate", "backend", "vanilla ms (IQR)", "local ms", "exposed", "exposed (free)"]
    head += ["pace ms (IQR)"]
    head += ["speed-up", "bound ms", "vanilla's cores busy", "CPU floor ms", "max speed-up"]
    head += ["pace vs vanilla (95% CIs)", f"{GOAL_SPEEDUP:g}x goal"]
    lines = []
    for rate, backend in dict.fromkeys((r.rate, r.backend) for r in rows):
        keys = ("vanilla", local_of("vanilla", backend), "pace")
        v, loc, p = (by.get((rate, backend, k)) for k in keys)
        if v is None or loc is None or p is None:
            continue
        cells = [rate, backend, f"{v.measured_ms:.1f} ({v.spread_ms:.0f})", _ms(loc.measured_ms)]
        exposed = v.measured_ms / loc.measured_ms - 1
        # Against the ranks running free (``LOCAL_FREE``), which no job that communicates does:
        # what the exposure would read if computing in step cost nothing.
        free = by.get((rate, backend, LOCAL_FREE))
        cells += [
            f"{exposed:+.0%}",
            f"{v.measured_ms / free.measured_ms - 1:+.0%}" if free else "-",
        ]
        cells += [
            f"{p.measured_ms:.1f} ({p.spread_ms:.0f})",
            f"{v.measured_ms / p.measured_ms:.3f}x",
        ]
        busy = f"{v.cores_busy:.0%}" if v.cores_busy is not None else "-"
        cells += [_ms(p.bound_ms), busy, _ms(p.cpu_floor_ms)]
        most = max((b for b in (p.bound_ms, p.cpu_floor_ms) if b), default=None)
        max_speedup = v.measured_ms / most if most else None
        beaten = max_speedup is not None and v.measured_ms / p.measured_ms > max_speedup
        cells += [
            (f"{max_speedup:.3f}x" + (" (pace below the bound)" if beaten else ""))
            if max_speedup
            else "-"
        ]
        cells += [
            against_vanilla(v, p),
            goal_verdict(exposed, v.measured_ms / p.measured_ms, max_speedup),
        ]
        lines.append(cells)
    _print_table(head, lines, markdown=markdown)


def _print_channel(rows: Sequence[Row], *, markdown: bool = False) -> None:
    """Per runtime variant: its units' channel time per iteration, measured and predicted,
    beside its period's error: where the two differences agree, the communication (not the
    computation) is what the model got wrong."""
    head = ["rate", "backend", "variant", "channel ms", "predicted ms", "channel miss ms"]
    head += ["period miss ms"]
    lines = []
    for r in rows:
        if r.channel_ms is None or r.predicted_channel_ms is None or r.predicted_ms is None:
            continue
        channel_miss = f"{r.channel_ms - r.predicted_channel_ms:+.1f}"
        period_miss = f"{r.measured_ms - r.predicted_ms:+.1f}"
        cells = [r.rate, r.backend, r.variant, _ms(r.channel_ms), _ms(r.predicted_channel_ms)]
        lines.append([*cells, channel_miss, period_miss])
    if lines:
        _print_table(head, lines, markdown=markdown)


# The variants of a compiled mode that train a schedule the compiler chose after the
# calibration launch, by the mode whose calibration schedule they replaced (``AGAIN``).
REPLACING = {
    "pace": "pace",
    "pace-sync": "pace-sync",
    NOJOIN_VARIANT: "pace",
    NOHEDGE_VARIANT: "pace",
}


class Replacement(NamedTuple):
    """A schedule the compiler chose after the calibration launch (``variant``) against the
    one that launch trained (``replaced``, trained again in the same timed launch): how much
    faster the model said it was, and how much faster it measured (``1 - new / old``)."""

    rate: str
    backend: str
    variant: str
    replaced: str
    predicted_gain: float
    measured_gain: float


def replacement_gains(rows: Sequence[Row]) -> list[Replacement]:
    """Every new schedule of ``rows`` beside the calibration's it replaced, both measured in
    one launch and predicted. The compiler picks the schedule its model replays fastest, so
    where the model errs, its pick is the one it over-rates most (the selection's bias): the
    calibration's schedule, whose own launch the model was fitted on, is the measured
    reference the pick must beat."""
    by = {(r.rate, r.backend, r.variant): r for r in rows}
    out = []
    for r in rows:
        mode = REPLACING.get(r.variant)
        old = by.get((r.rate, r.backend, f"{mode}{AGAIN}")) if mode else None
        if old is None or r.predicted_ms is None or old.predicted_ms is None:
            continue
        out.append(
            Replacement(
                r.rate,
                r.backend,
                r.variant,
                old.variant,
                1.0 - r.predicted_ms / old.predicted_ms,
                1.0 - r.measured_ms / old.measured_ms,
            )
        )
    return out


def _print_replacements(gains: Sequence[Replacement], *, markdown: bool = False) -> None:
    head = ["rate", "backend", "variant", "against", "predicted gain", "measured gain"]
    lines = [
        [
            g.rate,
            g.backend,
            g.variant,
            g.replaced,
            f"{g.predicted_gain:+.1%}",
            f"{g.measured_gain:+.1%}",
        ]
        for g in gains
    ]
    _print_table(head, lines, markdown=markdown)
    predicted = statistics.median(g.predicted_gain for g in gains)
    measured = statistics.median(g.measured_gain for g in gains)
    print(f"median over {len(gains)}: predicted {predicted:+.1%}, measured {measured:+.1%}")


def _print_idle(rows: Sequence[Row], *, markdown: bool = False) -> None:
    """Per overlapped variant: where its channel idled in an iteration (``IdleSplit``),
    measured and in the replay: the part of a period's miss that is not the channel's."""
    head = ["rate", "backend", "variant", "tail ms", "predicted", "head ms", "predicted"]
    head += ["within ms", "predicted", "idle miss ms", "head: backward", "local's", "dispatch"]
    head += ["skew", "other rank's", "local's faster"]
    lines = []
    for r in rows:
        got, want = r.idle, r.predicted_idle
        if got is None or want is None:
            continue
        pairs = [(got.tail_ms, want.tail_ms), (got.head_ms, want.head_ms)]
        pairs.append((got.within_ms, want.within_ms))
        miss = sum(a - b for a, b in pairs)
        cells = [r.rate, r.backend, r.variant, *(_ms(x) for pair in pairs for x in pair)]
        split = [got.head_backward_ms, got.head_local_ms, got.head_dispatch_ms, got.head_skew_ms]
        split += [got.head_ahead_ms, got.head_local_ahead_ms]
        lines.append([*cells, f"{miss:+.1f}", *(_ms(x) for x in split)])
    if lines:
        _print_table(head, lines, markdown=markdown)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", default="main", help=argparse.SUPPRESS)
    ap.add_argument("--link", help=argparse.SUPPRESS)
    ap.add_argument("--driver-script", default=__file__, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    ap.add_argument("--variants", help=argparse.SUPPRESS)
    ap.add_argument("--calls", help=argparse.SUPPRESS)
    ap.add_argument("--schedule", help=argparse.SUPPRESS)
    ap.add_argument("--sync-schedule", help=argparse.SUPPRESS)
    ap.add_argument("--again-schedule", help=argparse.SUPPRESS)
    ap.add_argument("--again-sync-schedule", help=argparse.SUPPRESS)
    ap.add_argument("--path-schedule", help=argparse.SUPPRESS)
    ap.add_argument("--nojoin-schedule", help=argparse.SUPPRESS)
    ap.add_argument("--nohedge-schedule", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="horovod", help=argparse.SUPPRESS)
    ap.add_argument("--rates", default="500mbit,1gbit,2gbit", help="tc rates, comma-separated")
    ap.add_argument("--backends", default="horovod,torch", help="horovod and/or torch")
    ap.add_argument("--batch", type=int, default=32, help="images per rank per iteration")
    ap.add_argument("--blocks", type=int, default=6, help="blocks per variant (alternating)")
    ap.add_argument("--steps", type=int, default=5, help="measured iterations per block")
    ap.add_argument("--reps", dest="comm_reps", type=int, default=9, help="reps per comm size")
    ap.add_argument("--trace", help="use this trace of pace:vgg-cifar instead of profiling")
    ap.add_argument(
        "--keep",
        metavar="DIR",
        help="write each rate's trace (with the fitted link), compiled schedule, predictions "
        "and launch logs (every rank's units, marks and gradient times) to DIR, e.g. for `pace "
        "timeline DIR/1gbit-torch.trace.json.gz --schedule ...` or bench_reachable.py DIR",
    )
    ap.add_argument("--markdown", action="store_true", help="print the final table as markdown")
    ap.add_argument(
        "--handoff",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="predict and compile the runtime's variants with their units' channel time "
        "measured in a short run of the probe-compiled schedule (default; --no-handoff: the "
        "interference probe's term alone)",
    )
    ap.add_argument(
        "--report-handoff",
        action="store_true",
        help="measure and print the runtime's units' channel time (see --handoff)",
    )
    ap.add_argument(
        "--compare-serial",
        action="store_true",
        help="also train variant pace-serial: the replay issuing one unit at a time",
    )
    ap.add_argument(
        "--compare-path",
        action="store_true",
        help=f"with Horovod, also train variant {PATH_VARIANT}: pace's schedule marked for "
        "Horovod's own path (what pace runs where the compiler predicts that path faster): "
        "hvd.DistributedOptimizer under Horovod's defaults, waited for by the runtime",
    )
    ap.add_argument(
        "--compare-joins",
        action="store_true",
        help=f"also train variant {NOJOIN_VARIANT}: pace's schedule compiled with the order "
        "search's moves only, no units joined",
    )
    ap.add_argument(
        "--compare-hedge",
        action="store_true",
        help=f"also train variant {NOHEDGE_VARIANT}: the schedule the calibrated model alone "
        "compiles to, not hedged over the probe's compute loss or a faster compute",
    )
    ap.add_argument(
        "--horovod-env",
        default="",
        metavar="K=V,...",
        help="Horovod settings for the pace launch on top of the runtime's (an experiment)",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="pin each rank's process to a core of its own (an experiment: the ranks stop "
        "taking each other's cores, as on separate machines)",
    )
    args, rest = ap.parse_known_args(argv)
    if args.pin:
        os.environ[PIN_ENV] = "1"
    _HOROVOD_OVERRIDES.update(env_pairs(args.horovod_env))
    if args.role == "main" and REINIT_CRASHES.intersection(_HOROVOD_OVERRIDES):
        _say(REINIT_WARNING)
    if args.role == "hvd-driver":
        hvd_driver(args.link, [a for a in rest if a != "--"], args.driver_script)
        return 0
    workers = {"comm": worker_comm, "train": worker_train, "interference": worker_interference}
    if args.role in workers:
        pin_rank()
        workers[args.role](args)
        _close_backend(args.backend)
        return 0
    if rest:
        ap.error(f"unrecognised arguments: {' '.join(rest)}")
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        print("bench_netns: needs root and iproute2 (ip, tc) to make namespaces", file=sys.stderr)
        return 2
    rows = measure(args)
    print()
    print(
        f"{MODEL}, batch {args.batch}/rank, 2 ranks in 2 network namespaces over a tc-limited "
        f"veth pair; median per-iteration period over {args.blocks} blocks x {args.steps} "
        "iterations per variant; predicted = simulator replay + measured optimizer step where "
        "the training thread runs it (not online, pace: they update in the background), from "
        "the calibration launch's compute (with --handoff) or the profile's"
    )
    _print_rows(rows, markdown=args.markdown)
    print()
    print(
        "vanilla's exposed communication (its time over local's, the ranks in step; "
        "exposed (free): over local-free's, the ranks running free) and pace's speed-up, "
        "against the most any schedule could gain: bound = the zero-overhead optimal preemptive "
        "makespan on the fitted link, or the interference bound under the pace launch's term "
        "where higher (the overlapped mode updates in the background: no step); CPU floor = "
        "the least, over the communicating variants of the timed launch, of the fraction of "
        "the host's cores busy (both ranks and the kernel's network work) times the median "
        "period; max speed-up = vanilla over the higher of the two; pace vs vanilla = faster "
        "or slower where the medians' 95% CIs are apart; the "
        f"{GOAL_SPEEDUP:g}x goal applies where vanilla is exposed by {GOAL_EXPOSED:.0%} or more "
        "(out of reach: the max speed-up is below it)"
    )
    _print_goal(rows, markdown=args.markdown)
    print()
    print(
        "the runtime's units: channel time per iteration (from when the last rank could start "
        "a unit, its issue there or its last completion, to when the last rank saw it done), "
        "measured and predicted, and the misses (measured - predicted) of the channel time and "
        "of the period"
    )
    _print_channel(rows, markdown=args.markdown)
    print()
    print(
        "where the overlapped modes' channel idled in an iteration, median over the counted "
        "iterations, measured and predicted: tail = from the last unit of the iteration before "
        "to the end of the forward that waited for it; head = from there to the start of the "
        "iteration's first unit (the backward until it is ready on every rank, its issue); "
        "within = between the iteration's units; idle miss = the three misses summed (about "
        "the period's miss less the channel's: each part is its own median); the head on the "
        "rank that issued the first unit last: backward = from its forward's end to the last "
        "gradient marked ready before its issue (what the replay's head models), local's = "
        "how long the same launch's `local` took from its forward's end to as many gradients "
        "(its slower rank: the same compute without the runtime), dispatch = "
        "from there to its issue (the runtime's wake-up and the unit's packing), skew = how "
        "much later than the other rank it issued; other rank's = the rank that issued first, "
        "from its forward's end to as many gradients, local's faster = `local`'s faster rank "
        "to as many (the same compute without the runtime: where the runtime's head is slow "
        "on the waited-for rank only)"
    )
    _print_idle(rows, markdown=args.markdown)
    if gains := replacement_gains(rows):
        print()
        print(
            "the compiler's schedules against the calibration launch's they replaced (`@cal`, "
            "trained again in the same launch): gain = 1 - new / old, predicted (the model "
            "that chose them) and measured"
        )
        _print_replacements(gains, markdown=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
