"""The cost of the overlapped mode's read guard (``pace.runtime.reads.ReadGuard``) per forward.

    python benchmarks/bench_read_guard.py [--model torchvision:resnet50] [--blocks 9]

Times the forward of a model (no gradients, batch 1, one thread: the host's work per call is
what the guard adds to) plain and inside the guard, block by block in turn so that the machine's
drift hits both alike. The guard sees every torch call; here it is told an update is always in
flight and no module's own wait runs, so it stays on for the whole forward and checks every
call's arguments (its most expensive case); its waits return at once. Prints the median
(min-max) forward time of each and the added cost per torch call (the calls counted with a
mode of their own).

Then the same for what a loop does between ``step()`` and the next forward, where the guard is
on from ``step()``'s end while updates are in flight: an EMA of the weights
(``torch.optim.swa_utils.AveragedModel.update_parameters``), plain and with the guard on
throughout (``after_step`` told an update is in flight; its waits return at once).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pace.profiler.workloads import build_workload
from pace.runtime.reads import ReadGuard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="torchvision:resnet50")
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--reps", type=int, default=10, help="forwards per block")
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = build_workload(args.model, batch_size=1, device="cpu")
    model = work.model.eval()
    params = list(model.parameters())
    calls = [0]

    def count(_indices: object, _what: str) -> None:
        calls[0] += 1

    names = [str(i) for i in range(len(params))]
    # Counting guard: how many first reads (parameters) one forward makes.
    counter = ReadGuard(params, names, count, lambda: True)

    def forward() -> None:
        work.step_fn(model)  # the workload's forward and loss

    with torch.no_grad():
        counter.begin()
        forward()
        counter.end()
        ops = _count_calls(forward)
        guard = ReadGuard(params, names, lambda _i, _w: None, lambda: True)
        times: dict[str, list[float]] = {"plain": [], "guarded": []}
        for _ in range(2):
            forward()  # warm-up
        for _ in range(args.blocks):
            for kind, block_ms in times.items():
                t0 = time.perf_counter()
                for _ in range(args.reps):
                    if kind == "guarded":
                        guard.begin()
                        forward()
                        guard.end()
                    else:
                        forward()
                block_ms.append((time.perf_counter() - t0) / args.reps * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.model}, batch 1, one thread: {ops} torch calls and {len(params)} parameters")
    print(f"{'variant':<10} {'forward ms':>11} {'min-max':>15}")
    for k, v in times.items():
        print(f"{k:<10} {med[k]:>11.3f} {f'{min(v):.3f}-{max(v):.3f}':>15}")
    added_us = (med["guarded"] - med["plain"]) * 1e3
    print(
        f"added: {added_us:.0f} us per forward ({added_us / max(ops, 1):.2f} us per torch call, "
        f"{(med['guarded'] / med['plain'] - 1) * 100:+.1f}%); first reads waited for: {calls[0]}"
    )
    _ema_after_step(model, params, names, args.blocks, args.reps)


def _ema_after_step(
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    names: list[str],
    blocks: int,
    reps: int,
) -> None:
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
    guard = ReadGuard(params, names, lambda _i, _w: None, lambda: True)
    times: dict[str, list[float]] = {"plain": [], "guarded": []}
    ema.update_parameters(model)  # warm-up
    for _ in range(blocks):
        for kind, block_ms in times.items():
            t0 = time.perf_counter()
            for _ in range(reps):
                if kind == "guarded":
                    guard.after_step()
                    ema.update_parameters(model)
                    guard.release()
                else:
                    ema.update_parameters(model)
            block_ms.append((time.perf_counter() - t0) / reps * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"an EMA update after step() (AveragedModel.update_parameters, {len(params)} parameters)")
    print(f"{'variant':<10} {'update ms':>11} {'min-max':>15}")
    for k, v in times.items():
        print(f"{k:<10} {med[k]:>11.3f} {f'{min(v):.3f}-{max(v):.3f}':>15}")
    print(f"added: {(med['guarded'] - med['plain']) * 1e3:.0f} us per update")


def _count_calls(forward: Callable[[], None]) -> int:
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        forward()
    return Count.n


if __name__ == "__main__":
    main()
