"""What the issue-order search gains (its moves in the order and its joins of units): each trace
compiled with and without it (``compile_trace(order_search=...)``), both schedules replayed in
the runtime's strict order.

    python benchmarks/bench_order_search.py [DIR ...] [--random N] [--markdown]

``DIR``: ``bench_netns.py --keep DIR`` directories; each calibrated trace is compiled as
``bench_netns.py`` compiles it (hedged over the probe's loss, the compute hedge at 1.25x), in
both modes, and replayed on the trace and with its compute 1.25x as fast. ``--random N``:
random traces (``pace.synth.random_trace``, seeds 0..N-1, 4/6/8 layers, per-call cost 30, 200
and 1000 us, three per-byte costs), the share the search changes and its gain. Deterministic
(replays), so no spread to state; the added compile time is wall time on this host.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout

SPEEDUP = 1.25
LAYERS = (4, 6, 8)
ALPHAS_US = (30.0, 200.0, 1000.0)
BETAS_US_PER_BYTE: tuple[float | None, ...] = (None, 3e-4, 1e-3)


def main() -> int:
    from benchmarks._common import kept_traces, show_table
    from pace.compiler import apply_what_if, compile_trace
    from pace.sim import runtime_replay_us
    from pace.synth import random_trace

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", type=Path, nargs="*")
    ap.add_argument("--random", type=int, default=0, metavar="N")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()

    def show(title: str, header: list[str], rows: list[list[object]]) -> None:
        show_table(title, header, rows, markdown=args.markdown)

    rows: list[list[object]] = []
    for directory in args.dirs:
        for tag, trace, hedge in kept_traces(directory):
            world = apply_what_if(trace, compute_speedup=SPEEDUP)
            for mode in ("overlap", "sync"):
                compiled = {
                    on: compile_trace(
                        trace,
                        mode=mode,
                        hedge=hedge,
                        compute_hedge=[SPEEDUP],
                        framework=False,
                        order_search=on,
                    )
                    for on in (False, True)
                }
                at = apply_what_if(world, mode=mode)
                off_us, on_us = (compiled[o].predicted_iteration_us for o in (False, True))
                fast_off, fast_on = (
                    runtime_replay_us(at, compiled[o].schedule) for o in (False, True)
                )
                meta = compiled[True].schedule.meta
                ch = meta["compute_hedge"]
                rows.append(
                    [
                        f"{directory.name}/{tag}",
                        mode,
                        f"{len(compiled[False].schedule.units)} / "
                        f"{len(compiled[True].schedule.units)}",
                        f"{off_us / 1e3:.1f}",
                        f"{on_us / 1e3:.1f}",
                        f"{on_us / off_us:.3f}",
                        f"{fast_off / 1e3:.1f} / {fast_on / 1e3:.1f}",
                        "yes" if compiled[True].schedule.in_order else "no",
                        ch["candidates"][ch["chosen"]],
                        f"{compiled[True].stage_seconds.get('order_search', 0.0):.2f}",
                    ]
                )
    if rows:
        show(
            "calibrated traces: without / with the order search (ms, the runtime's order)",
            [
                "trace",
                "mode",
                "units without / with",
                "without",
                "with",
                "ratio",
                f"x{SPEEDUP:g} without / with",
                "in_order",
                "compute hedge shipped",
                "search s",
            ],
            rows,
        )

    if args.random:
        gains: list[float] = []
        seconds: list[float] = []
        tried = joined = 0
        for seed in range(args.random):
            for layers in LAYERS:
                for alpha_us in ALPHAS_US:
                    for beta in BETAS_US_PER_BYTE:
                        trace = random_trace(
                            seed=seed, n_layers=layers, alpha_us=alpha_us, beta_us_per_byte=beta
                        )
                        res = compile_trace(trace, baselines=False, framework=False)
                        info = res.schedule.meta["order_search"]
                        tried += 1
                        seconds.append(res.stage_seconds.get("order_search", 0.0))
                        if info.get("moves"):
                            gains.append(1.0 - info["after_us"][0] / info["before_us"][0])
                            joined += info["joins"] > 0
        show(
            f"random traces ({tried}): the order search's gain where it changes the schedule",
            ["changed", "units joined in", "median gain", "max gain", "search s (median / max)"],
            [
                [
                    f"{len(gains)} of {tried}",
                    joined,
                    f"{statistics.median(gains):.2%}" if gains else "-",
                    f"{max(gains):.2%}" if gains else "-",
                    f"{statistics.median(seconds):.3f} / {max(seconds):.3f}",
                ]
            ],
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
