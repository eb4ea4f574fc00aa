"""What the compute hedge changes, on calibrated traces: each trace compiled as
``bench_netns.py`` compiles it (hedged over the calibrated and the probe's loss), with and
without ``compute_hedge``, both schedules replayed in the runtime's order with the trace's
compute scaled.

    python benchmarks/bench_compute_hedge.py DIR [--speedup 1.25] [--markdown]

``DIR``: a ``bench_netns.py --keep DIR`` directory (``RATE-BACKEND.trace.json.gz`` and, where
the run hedged, ``RATE-BACKEND.probe-loss.trace.json.gz``). Per trace: the units of each
schedule, and per compute scale (0.7 to 1.3 times the trace's compute time) the two replays
and their ratio (< 1: the hedged schedule is faster there). Deterministic (replays, no
timing), so no spread to state.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout

SCALES = (0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3)


def main() -> int:
    from benchmarks._common import kept_traces
    from pace.cli._output import print_table
    from pace.compiler import apply_what_if, compile_trace
    from pace.sim import runtime_replay_us

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--speedup", type=float, default=1.25)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    rows = []
    for tag, trace, hedge in kept_traces(args.dir):
        plain = compile_trace(trace, hedge=hedge, framework=False).schedule
        hedged = compile_trace(
            trace, hedge=hedge, compute_hedge=[args.speedup], framework=False
        ).schedule
        ratios = []
        for scale in SCALES:
            world = apply_what_if(trace, compute_speedup=1.0 / scale)
            us = [runtime_replay_us(world, s) for s in (plain, hedged)]
            ratios.append(f"{us[0] / 1e3:.1f} / {us[1] / 1e3:.1f} ({us[1] / us[0]:.3f})")
        chosen = hedged.meta["compute_hedge"]["chosen"]
        rows.append([tag, len(plain.units), len(hedged.units), "yes" if chosen else "no", *ratios])
    header = ["trace", "units", "hedged units", "changed", *(f"x{s:g} ms" for s in SCALES)]
    title = (
        f"pipeline's / hedged at x{args.speedup:g} (ratio), replayed in the runtime's order with "
        "the trace's compute time scaled"
    )
    if args.markdown:
        print(f"{title}\n\n| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(str(c) for c in r) + " |")
    else:
        print_table(title, header, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
