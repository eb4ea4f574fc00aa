"""Helpers shared by the benchmarks (the real-model tables of ``bench_models.py`` and
``bench_sweep.py``; the loopback Horovod launches of ``bench_runtime.py`` and
``bench_sync_forward.py``).

Import as ``from benchmarks._common import ...`` after putting the repository root on
``sys.path`` (the scripts do), so the same module serves ``python benchmarks/X.py`` and tests.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal

from pace.ir import Trace

ROOT = Path(__file__).resolve().parent.parent
TRACES_DIR = ROOT / "traces"

# The four shipped real-model traces (traces/README.md), in the paper's Table II order of families.
TRACES: tuple[str, ...] = ("vgg16", "resnet50", "transformer", "lstm_seq2seq")

# Every simulator baseline the headline tables report (``pace.sim.POLICIES`` minus
# ``horovod-old``, the pre-0.28 Horovod fusion rule kept for docs/baselines.md).
BASELINES: tuple[str, ...] = (
    "fifo",
    "horovod",
    "ddp",
    "tictac",
    "p3",
    "bytescheduler",
    "bytescheduler-tuned",
)

# ByteScheduler's credit window shares the channel between several units at once (processor
# sharing, docs/simulator.md); the one-channel replay of a compiled schedule cannot do that, so
# ``pace compile`` guarantees "no slower" only against the other baselines (and a 5% band
# against these two; tests/test_compile_guarantee.py).
SHARED_CHANNEL: tuple[str, ...] = ("bytescheduler", "bytescheduler-tuned")


def load_shipped(name: str) -> Trace:
    """The shipped trace ``traces/<name>.json.gz``."""
    from pace.io import load_trace

    return load_trace(TRACES_DIR / f"{name}.json.gz")


def kept_traces(directory: Path) -> Iterator[tuple[str, Trace, list[Trace]]]:
    """The calibrated traces of a ``bench_netns.py --keep DIR`` directory, in name order: the
    tag (``RATE-BACKEND``), the trace and the cost models it was hedged over (the probe's loss,
    where the run kept one), as ``bench_netns.py`` compiles them."""
    from pace.io import load_trace

    for path in sorted(directory.glob("*.trace.json.gz")):
        if path.name.endswith(".probe-loss.trace.json.gz"):
            continue
        tag = path.name.removesuffix(".trace.json.gz")
        probe = path.with_name(f"{tag}.probe-loss.trace.json.gz")
        yield tag, load_trace(path), [load_trace(probe)] if probe.exists() else []


def geomean(xs: Iterable[float]) -> float:
    """Geometric mean of positive numbers (``nan`` for none)."""
    vals = list(xs)
    if not vals:
        return math.nan
    return math.exp(sum(math.log(x) for x in vals) / len(vals))


def compute_only_us(trace: Trace) -> float:
    """The compute-only critical path of ``trace`` (no communication at all), in us."""
    from pace.analysis import analyze

    return float(analyze(trace).critical_path_us)


def horovodrun_loopback(
    script: str, worker_args: list[str], *, env_extra: Mapping[str, str] | None = None
) -> str:
    """Run ``script --worker WORKER_ARGS`` as 2 Horovod ranks on loopback (gloo, one compute
    thread each), with ``env_extra`` added to their environment (Horovod's settings are read
    once, by ``hvd.init()``), and return what they printed; a failed launch raises with its
    output."""
    horovodrun = shutil.which("horovodrun", path=str(Path(sys.executable).parent)) or "horovodrun"
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, script]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **(env_extra or {}))
    out = subprocess.run(
        [*cmd, "--worker", *worker_args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=1800,
    )
    return out.stdout


def iqr(xs: Sequence[float], *, method: Literal["inclusive", "exclusive"] = "exclusive") -> float:
    """The interquartile range of ``xs`` (``statistics.quantiles`` with ``method``); 0.0 for
    fewer than two values."""
    if len(xs) < 2:
        return 0.0
    q = statistics.quantiles(xs, n=4, method=method)
    return q[2] - q[0]


def env_pairs(text: str) -> dict[str, str]:
    """``K=V,K2=V2`` (a ``--horovod-env`` value) as a dict; empty text, no settings."""
    return dict(kv.split("=", 1) for kv in text.split(",") if kv)


_TICK_MS = 1e3 / os.sysconf("SC_CLK_TCK")


def host_busy_ms() -> float:
    """Core-milliseconds the whole host has spent busy since boot (``/proc/stat``'s cpu line:
    user, nice, system, irq, softirq; not idle or iowait, and not steal, the time the
    hypervisor ran something else: that is no work of this host's). Clock ticks: coarse."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = ticks[:7]
    return (user + nice + system + irq + softirq) * _TICK_MS


THREAD_CLASSES = ("training", "runtime", "backend")
"""Who used a process's CPU, as ``thread_cpu_ms`` splits it."""


def thread_cpu_ms() -> dict[str, float]:
    """CPU milliseconds this process has used so far, split by who used them: ``training`` (the
    main thread: compute, autograd's hooks, the optimizer where it runs there), ``runtime``
    (pace's own Python threads, named ``pace-*``: dispatch, copy-back, per-unit updates) and
    ``backend`` (every other thread: the C++ threads of gloo or Horovod, which move the bytes
    and sum them). Per-thread CPU clocks, so nanoseconds, not ticks; the kernel's interrupt
    and softirq work (the network path) is in none of them but in the host's total."""
    import threading
    import time

    total_ms = time.process_time() * 1e3
    split = dict.fromkeys(THREAD_CLASSES, 0.0)
    for t in threading.enumerate():
        if t.ident is None:
            continue
        try:
            used_ms = time.clock_gettime(time.pthread_getcpuclockid(t.ident)) * 1e3
        except OSError:  # the thread ended between the listing and the read
            continue
        if t is threading.main_thread():
            split["training"] += used_ms
        elif t.name.startswith("pace-"):
            split["runtime"] += used_ms
    # Python threads that ended (a closed engine's) fall into `backend`; blocks read deltas
    # while their variant's threads live, so those are constant offsets that cancel.
    split["backend"] = max(0.0, total_ms - sum(split.values()))
    return split


def show_table(
    title: str, header: Sequence[str], rows: Sequence[Sequence[object]], *, markdown: bool
) -> None:
    """Print a table: rich's (``pace.cli._output.print_table``), or markdown with ``markdown``."""
    if not markdown:
        from pace.cli._output import print_table

        print_table(title, header, rows)
        return
    print(f"{title}\n\n| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    print()
