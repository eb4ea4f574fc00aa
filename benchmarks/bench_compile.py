"""Full ``compile_trace`` time vs trace size, with a growth table.

    python benchmarks/bench_compile.py [--sizes 200x1500,5000x50000] [--fusion F] [--no-baselines]

Traces come from ``pace.synth.random_trace`` (seeded; ~2 tensors per layer, ``ops_per_layer``
chosen to hit the op count). ``compile`` is the time to the schedule (fusion + scheduling, the
``compile_seconds`` of ``pace compile``, wall and CPU time of this process); the baseline
replays are timed separately, one ``simulate`` per registered baseline (second table), and
``pace compile s`` is the wall time of the whole command, ``python -m pace compile TRACE -o OUT``
(every baseline included, imports and file I/O too), run as a subprocess on the saved trace.
Goals: compile < 1 s at 200 tensors / 1,500 ops and < 10 s at 5,000 / 50,000 (issue 4); the
whole command < 2 s at 200 tensors, < 5 s at 2,100, < 10 s at 5,000 / 50,000, and every
baseline well under a second (issue 14).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pace.cli._output import print_table
from pace.compiler import compile_trace
from pace.errors import LimitError
from pace.io import save_trace
from pace.ir import Trace
from pace.sim import POLICIES, simulate
from pace.synth import random_trace

DEFAULT_SIZES = "200x1500,500x4000,1000x10000,2000x20000,5000x50000"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="TENSORSxOPS,... (default: %(default)s)")
    ap.add_argument("--fusion", default="search", choices=("search", "paper", "none"))
    ap.add_argument("--no-baselines", action="store_true", help="skip the baseline replays")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-cli", action="store_true", help="skip the whole-command run")
    args = ap.parse_args()

    # Warm-up: imports (pulp, scipy, networkx) and first-call caches are not compile time.
    compile_trace(random_trace(seed=0, n_layers=4), fusion=args.fusion)
    rows = []
    policy_rows = []
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
            per_policy = {name: _replay_seconds(trace, name) for name in POLICIES}
            base_s = round(sum(per_policy.values()), 3)
            policy_rows.append(
                [len(trace.tensors), len(trace.ops)] + [f"{per_policy[n]:.3f}" for n in POLICIES]
            )
        total = time.perf_counter() - t0
        cli_s = "-" if args.no_cli else f"{_cli_seconds(trace):.2f}"
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
                cli_s,
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
            "pace compile s",
            "gap to bound",
        ],
        rows,
    )
    if policy_rows:
        print_table(
            "baseline replay seconds (one simulate per policy, trace analysis already cached)",
            ["tensors", "ops", *POLICIES],
            policy_rows,
        )


def _replay_seconds(trace: Trace, name: str) -> float:
    """Wall time of one ``simulate(trace, name)`` (a baseline over a work limit: its refusal)."""
    t = time.perf_counter()
    # A LimitError (a work limit): compare() leaves such a baseline out.
    with contextlib.suppress(LimitError):
        simulate(trace, name)
    return time.perf_counter() - t


def _cli_seconds(trace: Trace) -> float:
    """Wall time of ``python -m pace compile TRACE -o OUT`` on the saved trace."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        save_trace(trace, path)
        cmd = [sys.executable, "-m", "pace", "compile", str(path), "-o", str(Path(tmp) / "s.json")]
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - t


if __name__ == "__main__":
    main()
