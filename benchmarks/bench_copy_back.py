"""What scaling and packing a unit's gradients into its buffer costs the runtime's thread. One
process, no communication.

    python benchmarks/bench_copy_back.py [--rounds 40] [--unit-mib 9]

With torch.distributed the runtime averages as DDP does: it multiplies each gradient by
``1 / size`` while packing a fused unit into its flat buffer, and the reduction is a plain sum
(the copy back after it is a plain copy). Two ways to pack, on the gradients of
``pace:vgg-cifar`` (56 MiB, fp32) packed into units of about ``--unit-mib`` MiB in the
backward's order, as the throttled-link benchmark's schedules pack them:

* ``copy+scale``: one ``torch.cat`` of the pieces into the buffer, then scale the buffer in
  place (still the runtime's way on a GPU: two launches rather than one per piece);
* ``multiply-into``: ``pace.runtime.pack_pieces``, one ``torch.mul(..., out=)`` per piece,
  straight from the gradient into the buffer.

An iteration packs every unit once at two ranks' scale (0.5); each unit has a buffer of its own,
so an iteration streams all 56 MiB as the runtime does, not one cache-resident buffer. The two
alternate round by round (``torch.set_num_threads(1)``, a warm-up round first). Prints per way
the median and IQR of the per-iteration time, and the medians' ratio, and checks that both
wrote the same bits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks._common import iqr  # noqa: E402
from pace.profiler.workloads import vgg_cifar  # noqa: E402
from pace.runtime import pack_pieces  # noqa: E402

SCALE = 0.5  # two ranks
Pieces = list[torch.Tensor]


def packed_units(unit_bytes: int) -> list[tuple[torch.Tensor, Pieces]]:
    """The model's gradients (random values), in the backward's order, greedily grouped into
    units of at least ``unit_bytes``: each unit's buffer and its gradients."""
    torch.manual_seed(0)
    grads = [torch.randn(p.numel()) for p in reversed(list(vgg_cifar(10).parameters()))]
    units: list[tuple[torch.Tensor, Pieces]] = []
    pieces: list[torch.Tensor] = []
    pending_bytes = 0

    def close() -> None:
        units.append((torch.empty(sum(g.numel() for g in pieces)), list(pieces)))
        pieces.clear()

    for g in grads:
        pieces.append(g)
        pending_bytes += g.numel() * g.element_size()
        if pending_bytes >= unit_bytes:
            close()
            pending_bytes = 0
    if pieces:
        close()
    return units


def copy_then_scale(views: Pieces, out: torch.Tensor, scale: float) -> None:
    torch.cat(views, out=out)
    out.mul_(scale)


WAYS: dict[str, Callable[[Pieces, torch.Tensor, float], None]] = {
    "copy+scale": copy_then_scale,
    "multiply-into": pack_pieces,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--unit-mib", type=float, default=9.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    units = packed_units(int(args.unit_mib * 2**20))
    total_mib = sum(b.numel() * b.element_size() for b, _ in units) / 2**20
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    results: dict[str, list[list[int]]] = {}
    for r in range(args.rounds + 1):
        for name, way in WAYS.items() if r % 2 == 0 else reversed(WAYS.items()):
            for buf, _ in units:
                buf.zero_()
            t0 = time.perf_counter()
            for buf, pieces in units:
                way(pieces, buf, SCALE)
            elapsed = time.perf_counter() - t0
            if r:  # round 0 warms up
                times[name].append(elapsed * 1e3)
            results[name] = [buf.view(torch.int32).tolist() for buf, _ in units]
    same = results["copy+scale"] == results["multiply-into"]
    print(
        f"pace:vgg-cifar gradients, {total_mib:.1f} MiB in {len(units)} units of about "
        f"{args.unit_mib:g} MiB; one iteration packs every unit once (x{SCALE}); "
        f"{args.rounds} rounds, one thread"
    )
    print(f"{'way':<15} {'median ms/iteration':>20} {'IQR ms':>8} {'vs copy+scale':>14}")
    base = statistics.median(times["copy+scale"])
    for name, xs in times.items():
        med = statistics.median(xs)
        print(f"{name:<15} {med:>20.2f} {iqr(xs):>8.2f} {med / base:>13.3f}x")
    print(f"same bits in every buffer: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
