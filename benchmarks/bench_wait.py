"""Does compute run slower after the training thread waited? One process, no communication.

    python benchmarks/bench_wait.py [--rounds 30] [--wait-ms 300]

In the overlapped runtime a rank's forward waits for the last unit's update while the link
works, then computes the iteration's boundary: the rest of the forward and the backward's first
layers (the head, until the first unit's gradients are ready). On the throttled link that head
ran slower than `local`'s (docs/results.md). This times the same model (``pace:vgg-cifar``,
batch 10, one compute thread) in one process, iteration by iteration, after four kinds of wait
before the forward:

* ``warm``: none (back to back, as `local`);
* ``sleep``: ``time.sleep`` (the runtime's wait: the core may idle);
* ``spin``: a busy loop on the training thread (the core stays busy, no memory touched);
* ``stream``: a sleep while a second thread streams through 64 MiB (``a += b``), as a
  reduction of a fused unit does on the rank's cores.

Modes alternate round by round; in each round every mode runs one untimed iteration and then
the timed one, so the timed iteration follows the same wait twice. Prints, per mode, the
medians and IQRs of the forward, the head (the forward's end to the ``--gradient``-th gradient
marked ready) and the whole backward, and the medians' ratio to ``warm``'s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks._common import iqr  # noqa: E402

MODES = ("warm", "sleep", "spin", "stream")
STREAM_FLOATS = 8 << 20  # two buffers of 32 MiB: far beyond the caches


def wait(mode: str, seconds: float, work: Callable[[], None] | None = None) -> int:
    """Wait ``seconds`` the way ``mode`` says; the number of ``work`` calls a ``stream`` wait's
    second thread made (0 for the others)."""
    if mode == "warm":
        return 0
    if mode == "sleep":
        time.sleep(seconds)
        return 0
    if mode == "spin":
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        return 0
    if mode == "stream":
        if work is None:
            raise ValueError("a stream wait needs work to stream")
        stop = threading.Event()
        passes = [0]

        def run() -> None:
            while not stop.is_set():
                work()
                passes[0] += 1

        thread = threading.Thread(target=run, name="bench-wait-stream")
        thread.start()
        time.sleep(seconds)
        stop.set()
        thread.join()
        return passes[0]
    raise ValueError(f"unknown wait mode {mode!r}; choose one of {', '.join(MODES)}")


def head_ms(stamps_s: Sequence[float], forward_end_s: float, gradient: int) -> float:
    """Milliseconds from the forward's end to the ``gradient``-th (1-based) gradient marked
    ready after it."""
    after = sorted(s for s in stamps_s if s >= forward_end_s)
    if not 1 <= gradient <= len(after):
        raise ValueError(f"{len(after)} gradients after the forward, asked for the {gradient}-th")
    return (after[gradient - 1] - forward_end_s) * 1e3


def summary(values: Sequence[float]) -> tuple[float, float]:
    """Median and interquartile range."""
    return statistics.median(values), iqr(values, method="inclusive")


def measure(rounds: int, wait_s: float, gradient: int) -> dict[str, list[tuple[float, ...]]]:
    """Per mode, per round: (forward ms, head ms, backward ms)."""
    from pace.profiler.workloads import vgg_cifar

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = vgg_cifar(10)
    stamps: list[float] = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda _p: stamps.append(time.perf_counter()))
    x, y = torch.randn(10, 3, 32, 32), torch.randint(0, 10, (10,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    a, b = torch.ones(STREAM_FLOATS), torch.ones(STREAM_FLOATS)

    def iteration(mode: str) -> tuple[float, float, float]:
        opt.zero_grad()
        wait(mode, wait_s, lambda: a.add_(b))
        stamps.clear()
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        forward_end = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
        opt.step()
        return (
            (forward_end - start) * 1e3,
            head_ms(stamps, forward_end, gradient),
            (end - forward_end) * 1e3,
        )

    rows: dict[str, list[tuple[float, ...]]] = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode in MODES:
            iteration(mode)
            rows[mode].append(iteration(mode))
    return rows


def table(rows: dict[str, list[tuple[float, ...]]]) -> str:
    """The printed table: medians (IQR) and the medians' ratios to ``warm``'s."""
    base = [statistics.median(c) for c in zip(*rows["warm"], strict=True)]
    out = [
        "| wait | forward ms (IQR) | head ms (IQR) | backward ms (IQR) | forward / warm's "
        "| head / warm's | rounds |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, got in rows.items():
        cols = [summary(c) for c in zip(*got, strict=True)]
        cells = " | ".join(f"{m:.1f} ({iqr:.1f})" for m, iqr in cols)
        out.append(
            f"| {mode} | {cells} | {cols[0][0] / base[0]:.3f} | {cols[1][0] / base[1]:.3f} "
            f"| {len(got)} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=30, help="timed iterations per mode")
    ap.add_argument("--wait-ms", type=float, default=300.0, help="each wait, in ms")
    ap.add_argument(
        "--gradient",
        type=int,
        default=3,
        help="the head ends at this gradient after the forward (3: the last convolution's)",
    )
    args = ap.parse_args()
    if args.rounds < 2 or args.wait_ms < 0 or args.gradient < 1:
        ap.error("need --rounds >= 2, --wait-ms >= 0 and --gradient >= 1")
    rows = measure(args.rounds, args.wait_ms / 1e3, args.gradient)
    print(
        f"pace:vgg-cifar, batch 10, one compute thread, one process; {args.wait_ms:g} ms wait "
        f"before each forward; head = to gradient {args.gradient} after the forward"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
