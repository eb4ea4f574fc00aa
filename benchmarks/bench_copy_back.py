"""What averaging a reduced unit into its gradients costs the runtime's thread. One process, no
communication.

    python benchmarks/bench_copy_back.py [--rounds 40] [--unit-mib 9]

After a fused unit's all-reduce the runtime turns the sum into the average and hands each
piece back to its gradient. Two ways, on the gradients of ``pace:vgg-cifar`` (56 MiB, fp32)
packed into units of about ``--unit-mib`` MiB in the backward's order, as the throttled-link
benchmark's schedules pack them:

* ``scale+copy``: scale the whole buffer in place, then one ``torch._foreach_copy_`` of the
  pieces (what the runtime did before; still its way on a GPU);
* ``multiply-into``: ``pace.runtime.average_pieces``, one ``torch.mul(..., out=)`` per
  piece, straight from the buffer into the gradient.

An iteration averages every unit once at two ranks' scale (0.5); each unit has a buffer of its
own, so an iteration streams all 56 MiB as the runtime does, not one cache-resident buffer. The
two alternate round by round (``torch.set_num_threads(1)``, a warm-up round first). Prints per
way the median and IQR of the per-iteration time, and the medians' ratio, and checks that both
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
from pace.runtime import average_pieces  # noqa: E402
from pace.runtime.engine import scale_then_copy  # noqa: E402

SCALE = 0.5  # two ranks
CopyBack = list[tuple[torch.Tensor, int, int]]


def packed_units(unit_bytes: int) -> list[tuple[torch.Tensor, CopyBack]]:
    """The model's gradients (random values), in the backward's order, greedily packed into
    units of at least ``unit_bytes``: each unit's buffer and its copy-back list."""
    torch.manual_seed(0)
    grads = [torch.randn(p.numel()) for p in reversed(list(vgg_cifar(10).parameters()))]
    units: list[tuple[torch.Tensor, CopyBack]] = []
    pieces: list[torch.Tensor] = []
    pending_bytes = 0

    def close() -> None:
        spans, at = [], 0
        for g in pieces:
            spans.append((g, at, at + g.numel()))
            at += g.numel()
        units.append((torch.cat(pieces), spans))
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


WAYS: dict[str, Callable[[torch.Tensor, CopyBack, float], None]] = {
    "scale+copy": scale_then_copy,
    "multiply-into": average_pieces,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--unit-mib", type=float, default=9.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    units = packed_units(int(args.unit_mib * 2**20))
    total_mib = sum(b.numel() * b.element_size() for b, _ in units) / 2**20
    # A pristine copy of every buffer: each timed call starts from the same reduced sums.
    sums = [b.clone() for b, _ in units]
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    results: dict[str, list[list[int]]] = {}
    for r in range(args.rounds + 1):
        for name, way in WAYS.items() if r % 2 == 0 else reversed(WAYS.items()):
            for (buf, _), s in zip(units, sums, strict=True):
                buf.copy_(s)
            t0 = time.perf_counter()
            for buf, copy_back in units:
                way(buf, copy_back, SCALE)
            elapsed = time.perf_counter() - t0
            if r:  # round 0 warms up
                times[name].append(elapsed * 1e3)
            results[name] = [v.view(torch.int32).tolist() for _, cb in units for v, _, _ in cb]
    same = results["scale+copy"] == results["multiply-into"]
    print(
        f"pace:vgg-cifar gradients, {total_mib:.1f} MiB in {len(units)} units of about "
        f"{args.unit_mib:g} MiB; one iteration averages every unit once (x{SCALE}); "
        f"{args.rounds} rounds, one thread"
    )
    print(f"{'way':<15} {'median ms/iteration':>20} {'IQR ms':>8} {'vs scale+copy':>14}")
    base = statistics.median(times["scale+copy"])
    for name, xs in times.items():
        med = statistics.median(xs)
        print(f"{name:<15} {med:>20.2f} {iqr(xs):>8.2f} {med / base:>13.3f}x")
    print(f"same bits in every gradient: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
