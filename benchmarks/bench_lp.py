"""Scheduler compile time vs trace size: ``python benchmarks/bench_lp.py [--repeat N] [--quick]``.

Traces from ``pace.synth.random_trace(n_layers=N/2, tensors_per_layer=(2, 2), ops_per_layer=4)``
(N gradient tensors, 4 ops per layer, random alpha 0..50 us, 10 Gbps ring). Times are medians
over ``--repeat`` runs, in milliseconds.

Table 1 (exact path):
* ``reduce``: release/tail reduction (first call on a trace; later calls hit the cache);
* ``solve``: one ``solve_exact`` call (the fusion search's oracle);
* ``schedule``: ``pace.lp.schedule(trace)`` end to end — candidates, simulator verification of
  the finalists and the baselines' unit lists, units.

Table 2 (LP path, per ``max_slots``): slot length, slotted horizon, LP columns (aggregated) and
the paper's ``x_i(t)`` count they stand for, and
* ``cert``: the certificate — two deadline LPs (feasible at the optimum, infeasible one slot
  below) given the exact solver's slotted optimum as hint (HiGHS via pulp, and scipy);
* ``search``: the LP alone, no hint (lower bound, galloping, bisection), scipy backend
  (up to 200 tensors; 30 s limit);
* ``integral``: every LP variable integral at the optimum.
Results are recorded in ``docs/scheduling.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pace.analysis import _build as analyze_uncached  # noqa: E402
from pace.errors import SolverTimeoutError  # noqa: E402
from pace.lp import (  # noqa: E402
    choose_slot_us,
    reduction,
    schedule,
    slot_instance,
    solve_exact,
    solve_lp,
)
from pace.synth import random_trace  # noqa: E402


def _ms(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times = []
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="sizes up to 200 only")
    args = ap.parse_args()
    sizes = [10, 50, 200] if args.quick else [10, 50, 200, 500, 1000, 2000]
    traces = {
        n: random_trace(seed=n, n_layers=n // 2, tensors_per_layer=(2, 2), ops_per_layer=4)
        for n in sizes
    }

    print("Exact path (ms, median of", args.repeat, "runs)")
    print(f"{'tensors':>8} {'ops':>6} {'reduce':>8} {'solve':>8} {'schedule':>9}  chosen")
    for n, tr in traces.items():
        t_red, _ = _ms(partial(analyze_uncached, tr), args.repeat)
        red = reduction(tr)
        t_solve, _ = _ms(
            partial(
                solve_exact,
                red.release_us,
                red.duration_us,
                red.tail_us,
                compute_makespan_us=red.compute_makespan_us,
            ),
            args.repeat,
        )
        t_sched, s = _ms(partial(schedule, tr), args.repeat)
        row = f"{n:>8} {len(tr.ops):>6} {t_red:>8.2f} {t_solve:>8.2f} {t_sched:>9.1f}"
        print(f"{row}  {s.meta['chosen']}")

    print()
    print("LP path (ms; cert = 2 solves with the exact optimum as hint; search = no hint)")
    print(
        f"{'tensors':>8} {'max_slots':>9} {'slot_us':>8} {'D*':>6} {'columns':>8} {'x_i(t)':>9} "
        f"{'cert highs':>10} {'cert scipy':>10} {'search':>8} {'solves':>6} {'integral':>8}"
    )
    for n, tr in traces.items():
        red = reduction(tr)
        for max_slots in (200, 1000, 5000) if n <= 500 else (200, 1000):
            slot = choose_slot_us(red, max_slots=max_slots)
            inst = slot_instance(red, slot_us=slot)
            hint = round(
                solve_exact(
                    inst.release, inst.duration, inst.tail, compute_makespan_us=inst.compute
                ).makespan_us
            )
            t_h, sol = _ms(
                partial(solve_lp, inst, backend="highs", hint_slots=hint),
                args.repeat,
            )
            t_s, _ = _ms(
                partial(solve_lp, inst, backend="scipy", hint_slots=hint),
                args.repeat,
            )
            search, solves = f"{'-':>8}", f"{'-':>6}"
            if n <= 200:
                try:
                    t_b, full = _ms(partial(solve_lp, inst, backend="scipy", time_limit_s=30), 1)
                    search, solves = f"{t_b:8.0f}", f"{full.solves:>6}"
                    assert full.makespan_slots == sol.makespan_slots == hint
                except SolverTimeoutError:
                    search = f"{'>30s':>8}"
            print(
                f"{n:>8} {max_slots:>9} {slot:>8.1f} {sol.makespan_slots:>6} {sol.variables:>8} "
                f"{sol.slot_variables:>9} {t_h:>10.1f} {t_s:>10.1f} {search} {solves} "
                f"{sol.integral!s:>8}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
