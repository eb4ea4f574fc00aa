"""Simulator speed vs trace size: ``python benchmarks/bench_sim.py [--repeat N]``.

Traces from ``pace.synth.random_trace(n_layers=L, ops_per_layer=20)`` (20 ops and 1-2 gradient
tensors per layer). Times are medians over ``--repeat`` runs, in milliseconds:

* ``analyze``: the per-trace analysis, once per trace (cached by identity afterwards);
* ``replay``: one default-mode replay of one unit per tensor (the oracle call of the fusion and
  scheduler stages), op times not materialised;
* ``+op times``: the same replay with the per-op timeline read (lazy, computed on first access);
* ``credit 4``: processor-sharing replay with 4 units in flight;
* ``horovod``: run-time cycle fusion (128 MB, 1 ms);
* ``event loop``: the generic joint ops+channel loop on the same units (the cross-check path);
* ``1 stream``: one compute stream (always the joint loop).
Results are recorded in ``docs/simulator.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from pace.analysis import _build, analyze
from pace.sim import SimOptions, simulate, units_policy
from pace.sim.core import _simulate
from pace.sim.policies import partition_units
from pace.synth import random_trace


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def row_for(layers: int, r: int) -> list[float | int]:
    trace = random_trace(seed=7, n_layers=layers, ops_per_layer=20)
    prep = analyze(trace)
    units = partition_units(prep, prep.ready_order, max(prep.size_bytes))
    pol = units_policy(units)
    stream = SimOptions(one_compute_stream=True)
    return [
        layers,
        len(trace.ops),
        len(trace.tensors),
        median_ms(lambda: _build(trace), r),
        median_ms(lambda: simulate(trace, pol), r),
        median_ms(lambda: simulate(trace, pol).op_start_us, r),
        median_ms(lambda: simulate(trace, pol, options=SimOptions(credit=4)), r),
        median_ms(lambda: simulate(trace, "horovod"), r),
        median_ms(lambda: _simulate(trace, pol, options=SimOptions(), force_event_loop=True), r),
        median_ms(lambda: simulate(trace, pol, options=stream), r),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layers", type=int, nargs="*", default=[50, 250, 1000, 2500])
    args = ap.parse_args()
    cols = [
        "layers",
        "ops",
        "tensors",
        "analyze",
        "replay",
        "+op times",
        "credit 4",
        "horovod",
        "event loop",
        "1 stream",
    ]
    print(" | ".join(f"{c:>10}" for c in cols))
    for layers in args.layers:
        row = row_for(layers, args.repeat)
        cells = [f"{v:>10,.1f}" if isinstance(v, float) else f"{v:>10,}" for v in row]
        print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
