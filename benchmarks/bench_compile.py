"""Full ``compile_trace`` time vs trace size, with a growth table.

    python benchmarks/bench_compile.py [--sizes 200x1500,5000x50000] [--fusion F] [--no-baselines]

Traces come from ``pace.synth.random_trace`` (seeded; ~2 tensors per layer, ``ops_per_layer``
chosen to hit the op count). ``compile`` is the time to the schedule (fusion + scheduling, the
``compile_seconds`` of ``pace compile``, wall and CPU time of this process); the baseline
replays (``pace.sim.compare``) are timed separately. Goals (issue 4): compile < 1 s at 200
tensors / 1,500 ops and < 10 s at 5,000 / 50,000.
"""

from __future__ import annotations

import argparse
import math
import os
import time

from pace.cli._output import print_table
from pace.compiler import compile_trace
from pace.sim import compare
from pace.synth import random_trace

DEFAULT_SIZES = "200x1500,500x4000,1000x10000,2000x20000,5000x50000"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="TENSORSxOPS,... (default: %(default)s)")
    ap.add_argument("--fusion", default="search", choices=("search", "paper", "none"))
    ap.add_argument("--no-baselines", action="store_true", help="skip the baseline replays")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    # Warm-up: imports (pulp, scipy, networkx) and first-call caches are not compile time.
    compile_trace(random_trace(seed=0, n_layers=4), fusion=args.fusion)
    rows = []
    prev: tuple[int, float] | None = None
    for spec in args.sizes.split(","):
        n_tensors, n_ops = (int(x) for x in spec.lower().split("x"))
        n_layers = max(1, n_tensors // 2)
        ops_per_layer = max(2, round(n_ops / n_layers))
        trace = random_trace(
            seed=args.seed,
            n_layers=n_layers,
            tensors_per_layer=(1, 3),
            ops_per_layer=ops_per_layer,
        )
        t0 = time.perf_counter()
        c0 = time.process_time()
        res = compile_trace(trace, fusion=args.fusion, baselines=False)
        # CPU time of this process: on a shared, loaded machine wall time overstates the cost.
        compile_cpu = time.process_time() - c0
        base_s: float | str = "-"
        if not args.no_baselines:
            tb = time.perf_counter()
            compare(trace)
            base_s = round(time.perf_counter() - tb, 3)
        total = time.perf_counter() - t0
        st = res.stage_seconds
        n = len(trace.tensors)
        growth = "-"
        if prev is not None:
            # Empirical exponent k in cpu time ~ N^k between consecutive sizes.
            growth = f"{math.log(compile_cpu / prev[1]) / math.log(n / prev[0]):.2f}"
        prev = (n, compile_cpu)
        rows.append(
            [
                n,
                len(trace.ops),
                len(res.plan.groups),
                round(st.get("fusion", 0.0), 3),
                round(st.get("schedule", 0.0), 3),
                round(res.compile_seconds, 3),
                round(compile_cpu, 3),
                growth,
                base_s,
                round(total, 3),
                f"{res.gap * 100:.3f}%",
            ]
        )
        print(f"done {n} tensors / {len(trace.ops)} ops in {total:.2f} s", flush=True)
    print_table(
        f"pace compile (fusion={args.fusion}) time vs size; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
        [
            "tensors",
            "ops",
            "groups",
            "fusion s",
            "schedule s",
            "compile s",
            "compile cpu s",
            "growth k (cpu)",
            "baselines s",
            "total s",
            "gap to bound",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
