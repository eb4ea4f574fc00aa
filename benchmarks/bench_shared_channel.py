"""How often, and by how much, ByteScheduler's shared channel beats the compiled schedule.

    python benchmarks/bench_shared_channel.py [--traces 300] [--max-layers 10] [--seed 0]

ByteScheduler's credit window runs several units at once and the simulator lets them share the
bandwidth (processor sharing, docs/simulator.md): preemption without paying ``alpha`` again,
which the one-channel replay of a compiled schedule cannot express. ``pace compile`` therefore
guarantees only a band against these two policies (tests/test_compile_guarantee.py); this
script measures the band on random traces drawn like the test's strategy
(``tests/strategies.traces``: 1 to ``--max-layers`` layers, random tensors per layer, ops per
layer and skip probability, random alpha). It prints, per policy, on how many traces it replays
faster than the compiled default schedule, and the median and maximum excess.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import SHARED_CHANNEL
from pace.compiler import compile_trace
from pace.ir import Trace
from pace.synth import (
    MIN_OPS_PER_LAYER,
    SKIP_PROB_CHOICES,
    TENSORS_PER_LAYER_CHOICES,
    random_trace,
)


def draw_trace(rnd: random.Random, max_layers: int) -> Trace:
    """One trace with the parameter distribution of ``tests/strategies.traces``."""
    return random_trace(
        seed=rnd.randrange(2**32),
        n_layers=rnd.randint(1, max_layers),
        tensors_per_layer=rnd.choice(TENSORS_PER_LAYER_CHOICES),
        ops_per_layer=rnd.randint(MIN_OPS_PER_LAYER, 4),
        skip_prob=rnd.choice(SKIP_PROB_CHOICES),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=300)
    ap.add_argument("--max-layers", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    excess: dict[str, list[float]] = {name: [] for name in SHARED_CHANNEL}
    worst: dict[str, str] = {}
    for _ in range(args.traces):
        trace = draw_trace(rnd, args.max_layers)
        res = compile_trace(trace)
        for name in SHARED_CHANNEL:
            over = res.predicted_iteration_us / res.baselines[name] - 1.0
            if over > 1e-9:
                if not excess[name] or over > max(excess[name]):
                    worst[name] = str(trace.meta.get("seed"))
                excess[name].append(over)
    print(
        f"{args.traces} random traces, 1-{args.max_layers} layers (seed {args.seed}): "
        "where the policy replays faster than the compiled schedule"
    )
    print(f"{'policy':22s} {'traces':>7s} {'median excess':>14s} {'max excess':>11s}  worst seed")
    for name in SHARED_CHANNEL:
        xs = excess[name]
        med = f"{100 * statistics.median(xs):.2f}%" if xs else "-"
        top = f"{100 * max(xs):.2f}%" if xs else "-"
        print(f"{name:22s} {len(xs):>7d} {med:>14s} {top:>11s}  {worst.get(name, '-')}")


if __name__ == "__main__":
    main()
