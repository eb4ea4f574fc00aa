"""How much computation slows down while all-reduces run beside it: the trace's interference term.

Measured on every rank at once, inside the job's own backend (a torch process group or
Horovod), with one compute thread as in training:

1. ``plain``: a compute probe (a matrix product, one thread) timed before the backend starts;
2. ``idle``: the same probe with the backend started and no collective in flight (Horovod's
   background loop polls the network every cycle);
3. ``busy``: per message size, the same number of back-to-back all-reduces of that size on
   every rank, first alone (their time is ``alone``), then on a thread while the main thread
   times the probe (their time is ``beside``).

The probe's slowdown gives the fraction of compute progress lost, ``1 - plain / busy``. The
model (:class:`pace.ir.Interference`) charges, while a call of ``b`` bytes holds the channel for
``d`` us, ``idle_loss + (us_per_call + us_per_byte * b) / d``; :func:`fit_interference` fits
``us_per_call`` and ``us_per_byte`` by non-negative least squares on ``(loss - idle_loss) * d``,
and ``comm_us_per_call`` and ``comm_stretch`` the same way on ``beside - alone =
comm_us_per_call + comm_stretch * alone``.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pace.ir import Interference

__all__ = [
    "InterferenceSample",
    "combine_ranks",
    "drift_corrected_loss",
    "fit_interference",
    "measure_interference",
    "measure_on_rank",
    "probe_us",
]

# The probe: one thread multiplying 160x160 matrices takes ~0.3 ms on this class of CPU; short
# enough to sample a window of a few hundred ms many times, long enough to time reliably.
_PROBE_N = 160
_PROBE_REPS = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class InterferenceSample:
    """One message size: its call time, and the compute loss measured while it ran."""

    size_bytes: int
    call_us: float  # one call, beside the probe
    loss: float
    probes: int
    alone_us: float = 0.0  # one call, nothing else running (0: not measured)


def matmul_probe() -> Callable[[], None]:
    """The default compute probe: a few products of 160x160 matrices on one thread."""
    import torch

    state = [torch.randn(_PROBE_N, _PROBE_N)]
    b = torch.randn(_PROBE_N, _PROBE_N)

    def run() -> None:
        a = state[0]
        for _ in range(_PROBE_REPS):
            a = torch.mm(a, b) * 1e-3
        state[0] = a

    return run


def probe_us(probe: Callable[[], None] | None = None, reps: int = 40) -> float:
    """Median time of one call of ``probe`` (default :func:`matmul_probe`), in us. A training
    step of the model itself (forward and backward, no communication) is the most faithful
    probe: it loads the cores and caches as the job does."""
    run = probe or matmul_probe()
    run()  # warm
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _probe_while(alive: Callable[[], bool], run: Callable[[], None]) -> list[float]:
    times = []
    while alive():
        t0 = time.perf_counter()
        run()
        if alive():  # only probes that ran entirely while the bytes moved
            times.append(time.perf_counter() - t0)
    return times


def measure_interference(
    allreduce: Callable[[Any], None],
    *,
    sizes_bytes: Sequence[int],
    calls: Sequence[int],
    plain_us: float,
    probe: Callable[[], None] | None = None,
    idle_reps: int = 40,
) -> tuple[float, list[InterferenceSample]]:
    """On this rank: the idle probe time and one sample per size (``calls[i]`` back-to-back
    all-reduces of ``sizes_bytes[i]``, the same counts on every rank). ``plain_us``: the probe
    measured before the backend started; ``probe``: the compute timed (default: products of
    small matrices). Every rank must call this at the same time.

    The idle probes are taken in chunks before, between and after the sizes, and each size's
    slowdown is taken against the idle chunks on either side of it: a shared machine drifts
    over the seconds this takes, and a loss measured against a reference taken long before
    would be the drift's, not the all-reduces'."""
    import torch

    run = probe or matmul_probe()
    run()  # warm
    per_chunk = max(2, -(-idle_reps // (len(sizes_bytes) + 1)))
    idle_all: list[float] = []

    def idle_chunk() -> float:
        times = []
        for _ in range(per_chunk):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        idle_all.extend(times)
        return statistics.median(times) * 1e6

    before_us = idle_chunk()
    measured = []
    for size, n_calls in zip(sizes_bytes, calls, strict=True):
        buf = torch.ones(max(1, size // 4))
        allreduce(buf)  # warm: connections and buffers of this size
        t0 = time.perf_counter()
        for _ in range(n_calls):
            allreduce(buf)
        alone_us = (time.perf_counter() - t0) * 1e6 / n_calls
        elapsed: list[float] = []

        def comm(buf: Any = buf, n_calls: int = n_calls, elapsed: list[float] = elapsed) -> None:
            t0 = time.perf_counter()
            for _ in range(n_calls):
                allreduce(buf)
            elapsed.append(time.perf_counter() - t0)

        thread = threading.Thread(target=comm, name="pace-interference-comm", daemon=True)
        thread.start()
        busy = _probe_while(thread.is_alive, run)
        thread.join()
        after_us = idle_chunk()
        measured.append(
            (buf, elapsed[0] * 1e6 / n_calls, busy, (before_us + after_us) / 2, alone_us)
        )
        before_us = after_us
    idle_us = statistics.median(idle_all) * 1e6
    samples = []
    for buf, call_us, busy, ref_us, alone_us in measured:
        busy_us = statistics.median(busy) * 1e6 if busy else ref_us
        samples.append(
            InterferenceSample(
                size_bytes=int(buf.numel() * 4),
                call_us=call_us,
                loss=drift_corrected_loss(
                    plain_us=plain_us, idle_us=idle_us, ref_us=ref_us, busy_us=busy_us
                ),
                probes=len(busy),
                alone_us=alone_us,
            )
        )
    return idle_us, samples


def drift_corrected_loss(
    *, plain_us: float, idle_us: float, ref_us: float, busy_us: float
) -> float:
    """The fraction of compute lost beside the calls, against the probe before the backend
    started: the slowdown ``busy / ref`` against the idle probes taken around the calls, carried
    to the whole measurement's idle time (``busy * idle / ref``: what the probe would have
    taken beside the calls had the machine run as it did on average). A drift of the machine
    that scales ``busy`` and ``ref`` alike cancels."""
    if busy_us <= 0 or ref_us <= 0:
        return 0.0
    return max(0.0, 1.0 - plain_us * ref_us / (busy_us * idle_us))


def fit_interference(
    plain_us: float, idle_us: float, samples: Sequence[InterferenceSample]
) -> tuple[Interference, float]:
    """The interference term and its fit quality (R^2 of the per-call loss in us).

    ``idle_loss = 1 - plain / idle``; per size, the loss beyond idle, in us per call, is
    ``(loss - idle_loss) * call_us``, fitted as ``us_per_call + us_per_byte * bytes``.
    """
    import numpy as np
    from scipy.optimize import nnls

    idle_loss = max(0.0, 1.0 - plain_us / idle_us) if idle_us > 0 else 0.0
    x = np.array([s.size_bytes for s in samples], dtype=float)
    y = np.array([max(0.0, s.loss - idle_loss) * s.call_us for s in samples], dtype=float)
    scale = float(x.max()) if len(x) else 1.0
    (per_call, per_byte_scaled), _ = nnls(np.column_stack([np.ones_like(x), x / scale]), y)
    pred = per_call + per_byte_scaled * x / scale
    ss_tot = float(((y - y.mean()) ** 2).sum()) if len(y) > 1 else 0.0
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    # A call beside compute: (1 + comm_stretch) times its time alone, plus comm_us_per_call.
    timed = [s for s in samples if s.alone_us > 0]
    stretch = extra_us = 0.0
    if timed:
        alone = np.array([s.alone_us for s in timed], dtype=float)
        slower = np.array([max(0.0, s.call_us - s.alone_us) for s in timed], dtype=float)
        a_scale = float(alone.max())
        (extra_us, stretch_scaled), _ = nnls(
            np.column_stack([np.ones_like(alone), alone / a_scale]), slower
        )
        stretch = float(stretch_scaled) / a_scale
    term = Interference(
        us_per_byte=float(per_byte_scaled) / scale,
        us_per_call=float(per_call),
        idle_loss=idle_loss,
        comm_stretch=stretch,
        comm_us_per_call=float(extra_us),
        samples=tuple((s.size_bytes, round(s.loss, 6)) for s in samples),
    )
    return term, r2


def measure_on_rank(
    allreduce: Callable[[Any], None],
    *,
    sizes_bytes: Sequence[int],
    call_us: Sequence[float],
    plain_us: float,
    out: str,
    rank: int,
    window_us: float = 500_000.0,
    probe: Callable[[], None] | None = None,
    idle_reps: int = 40,
) -> None:
    """:func:`measure_interference` on this rank, each size called back to back for about
    ``window_us`` (``call_us``: a call's time alone, the same on every rank, so every rank makes
    the same number of calls); writes the measurement to ``out.RANK`` for :func:`combine_ranks`.
    """
    import json
    from pathlib import Path

    calls = [max(3, round(window_us / max(us, 1.0))) for us in call_us]
    idle_us, samples = measure_interference(
        allreduce,
        sizes_bytes=sizes_bytes,
        calls=calls,
        plain_us=plain_us,
        probe=probe,
        idle_reps=idle_reps,
    )
    payload = {
        "plain_us": plain_us,
        "idle_us": idle_us,
        "samples": [[s.size_bytes, s.call_us, s.loss, s.probes, s.alone_us] for s in samples],
    }
    Path(f"{out}.{rank}").write_text(json.dumps(payload))


def combine_ranks(out: str, ranks: int) -> tuple[float, float, list[InterferenceSample]]:
    """The ranks' measurements (``out.0`` .. ``out.{ranks-1}``), averaged: plain and idle probe
    times and one sample per size."""
    import json
    from pathlib import Path

    data = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(ranks)]
    plain = statistics.fmean(d["plain_us"] for d in data)
    idle = statistics.fmean(d["idle_us"] for d in data)
    samples = []
    for rows in zip(*(d["samples"] for d in data), strict=True):
        samples.append(
            InterferenceSample(
                size_bytes=int(rows[0][0]),
                call_us=statistics.fmean(r[1] for r in rows),
                loss=statistics.fmean(r[2] for r in rows),
                probes=sum(int(r[3]) for r in rows),
                alone_us=statistics.fmean(r[4] for r in rows),
            )
        )
    return plain, idle, samples
