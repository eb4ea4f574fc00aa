"""What the cost model allows: the compiled schedule against the best one a wide search finds,
and the speed-up over vanilla that leaves.

    python benchmarks/bench_reachable.py DIR [DIR ...] [--steps N] [--seeds K] [--markdown]

``DIR``: what ``bench_netns.py --keep DIR`` wrote. Per rate and backend: the trace the compiler
compiled on (``RATE-BACKEND.trace.json.gz``), the schedule it shipped
(``RATE-BACKEND.schedule.json``) and the launch's predictions (``RATE-BACKEND.predicted.json``,
written since the predictions were kept; without it the speed-up columns are blank).

The compiler searches parts of the space in turn: the LP places the jobs, the fusion DP groups
tensors, the order search (``pace.order_search``) moves and joins whole units. None of them
moves part of a tensor from one unit to another once the units exist. The search here takes
every schedule the runtime can run: any partition of every tensor's bytes into units (slices
included, whole elements, one dtype per unit, as the runtime requires), in any issue
order, each replayed as the runtime issues it (``pace.sim.runtime_replay_us``: the compiler's
own prediction, with the trace's interference, update and copy-back costs). It is simulated
annealing from the compiled schedule, one step at a time:

- two neighbouring units swapped in the order;
- two neighbouring units joined;
- a unit split in two;
- a slice moved to another unit;
- a slice cut in two (at 1/8 to 7/8 of its bytes) and its second part moved to another unit,
  or to a new one anywhere in the order.

A step slower by ``d`` is taken with probability ``exp(-d / T)``, ``T`` falling geometrically
from ``START_TEMPERATURE`` of the compiled schedule's period to ``END_TEMPERATURE`` of it.

A schedule the compiler sent to the framework's own path (``framework`` in the file) is searched
from its units; the speed-up columns then set the units against vanilla through the path's own
replay on the trace, and "speed-up compiled" is the path's, marked "(path)".

It is a search, not a bound: the LP's bound (``pace.lp.lower_bound_us``, printed beside) is
below every schedule but charges no per-call cost and lets a tensor's bytes go anywhere at no
price. Where the best found and the compiled schedule are close, the compiler is at what the
model knows how to reach, and ``vanilla / best`` is the speed-up the model allows: a goal above
it needs another host or another model, not another schedule. Seeds give the spread.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from pace.ir import Schedule, Slice, Trace, Unit  # noqa: E402

START_TEMPERATURE = 0.005
"""The annealing's first temperature, relative to the compiled schedule's period: a step
0.5% slower is taken with probability 1/e at first."""
END_TEMPERATURE = 1e-6
"""Its last: in effect a descent."""
CUTS = (1 / 8, 1 / 4, 1 / 2, 3 / 4, 7 / 8)
"""Where a slice may be cut, as a share of its bytes."""
MIN_CUT_BYTES = 1 << 16
"""Slices smaller than this are moved whole, never cut: a cut costs a call, and a piece of a
few KiB carries less than that call's cost on any link this project measured."""
GOAL = 1.15

Piece = tuple[str, int, int]
"""A tensor's byte range ``[lo, hi)`` in one unit."""
State = list[list[Piece]]
"""Units in issue order, each its pieces."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Annealed:
    """Where one annealing run ended: the best schedule it met (in the runtime's order,
    ``in_order``), its replay, the start's, and the replays it spent."""

    schedule: Schedule
    iteration_us: float
    start_us: float
    evaluations: int


def state_of(schedule: Schedule) -> State:
    """``schedule``'s units in issue order (priority, then file order), each its slices."""
    units = sorted(enumerate(schedule.units), key=lambda iu: (iu[1].priority, iu[0]))
    return [
        [(s.tensor, s.offset_bytes, s.offset_bytes + s.size_bytes) for s in u.slices]
        for _, u in units
    ]


def _coalesced(unit: Sequence[Piece]) -> list[Piece]:
    """``unit``'s pieces in order, the touching pieces of one tensor joined."""
    out: list[Piece] = []
    for name, lo, hi in sorted(unit):
        if out and out[-1][0] == name and out[-1][2] == lo:
            out[-1] = (name, out[-1][1], hi)
        else:
            out.append((name, lo, hi))
    return out


def schedule_of(base: Schedule, state: State) -> Schedule:
    """``state`` as a schedule of ``base``'s trace: priorities in its order, ``in_order``."""
    units = tuple(
        Unit(
            priority=float(i),
            slices=tuple(Slice(tensor=n, offset_bytes=lo, size_bytes=hi - lo) for n, lo, hi in u),
        )
        for i, u in enumerate(state)
    )
    return dataclasses.replace(base, units=units, in_order=True, predicted_iteration_us=0.0)


def _key(state: State) -> tuple[tuple[Piece, ...], ...]:
    return tuple(tuple(u) for u in state)


def step(state: State, rng: random.Random, kinds: dict[str, tuple[int, str]]) -> State:
    """One of the module doc's steps from ``state`` (a new state; possibly the same schedule),
    units of one ``Tensor.fusion_kind`` only (``kinds``: per tensor), touching pieces of a
    tensor in a unit joined."""
    units = [list(u) for u in state]
    i = rng.randrange(len(units))
    kind = rng.randrange(5)
    if kind == 0 and len(units) > 1:  # swap with the next
        j = (i + 1) % len(units)
        units[i], units[j] = units[j], units[i]
    elif kind == 1 and len(units) > 1:  # join with the next
        j = min(i + 1, len(units) - 1) if i + 1 < len(units) else i - 1
        lo, hi = sorted((i, j))
        units[lo] = units[lo] + units[hi]
        del units[hi]
    elif kind == 2 and len(units[i]) > 1:  # split in two
        u = sorted(units[i])
        cut = rng.randrange(1, len(u))
        units[i : i + 1] = [u[:cut], u[cut:]]
    elif kind == 3 and len(units) > 1:  # move a piece to another unit
        piece = units[i].pop(rng.randrange(len(units[i])))
        units[rng.randrange(len(units))].append(piece)
    elif kind == 4:  # cut a piece, its second part elsewhere
        k = rng.randrange(len(units[i]))
        name, lo, hi = units[i][k]
        size = kinds[name][0]  # the element size
        mid = lo + int((hi - lo) * rng.choice(CUTS)) // size * size
        if hi - lo >= MIN_CUT_BYTES and lo < mid < hi:
            units[i][k] = (name, lo, mid)
            j = rng.randrange(len(units) + 1)
            if j == len(units):
                units.insert(rng.randrange(len(units) + 1), [(name, mid, hi)])
            else:
                units[j].append((name, mid, hi))
    out = [_coalesced(u) for u in units if u]
    if any(len({kinds[n] for n, _, _ in u}) > 1 for u in out):
        return [list(u) for u in state]  # the runtime refuses a unit of two dtypes
    return out


def anneal(
    trace: Trace,
    schedule: Schedule,
    *,
    steps: int,
    seed: int,
    replay_us: Callable[[Trace, Schedule], float] | None = None,
) -> Annealed:
    """Simulated annealing from ``schedule`` over the schedules of ``trace`` (module doc),
    ``steps`` steps, objective ``replay_us`` (the runtime's order by default)."""
    from pace.sim import runtime_replay_us

    replay = replay_us or runtime_replay_us
    kinds = {t.name: t.fusion_kind for t in trace.tensors}
    seen: dict[tuple[tuple[Piece, ...], ...], float] = {}

    def cost(state: State) -> float:
        key = _key(state)
        if key not in seen:
            seen[key] = replay(trace, schedule_of(schedule, state))
        return seen[key]

    rng = random.Random(seed)
    current = [_coalesced(u) for u in state_of(schedule)]
    start_us = now_us = cost(current)
    best, best_us = current, now_us
    hot, cold = START_TEMPERATURE * start_us, END_TEMPERATURE * start_us
    for n in range(steps):
        temperature = hot * (cold / hot) ** (n / max(steps - 1, 1))
        cand = step(current, rng, kinds)
        cand_us = cost(cand)
        if cand_us <= now_us or rng.random() < math.exp(-(cand_us - now_us) / temperature):
            current, now_us = cand, cand_us
            if now_us < best_us:
                best, best_us = current, now_us
    found = schedule_of(schedule, best)
    return Annealed(
        schedule=dataclasses.replace(found, predicted_iteration_us=best_us),
        iteration_us=best_us,
        start_us=start_us,
        evaluations=len(seen),
    )


def _predicted(path: Path) -> dict[str, float]:
    from pace.io import load_json

    if not path.exists():
        return {}
    return {k: float(v) for k, v in load_json(path)["predicted_ms"].items()}


def main() -> int:
    from benchmarks._common import kept_traces, show_table
    from pace.compiler import framework_path_us
    from pace.io import load_schedule
    from pace.lp import lower_bound_us
    from pace.sim import runtime_replay_us

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", type=Path, nargs="+")
    ap.add_argument("--steps", type=int, default=30000, help="annealing steps per seed")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()

    rows: list[list[object]] = []
    for directory in args.dirs:
        for tag, trace, _ in kept_traces(directory):
            schedule = load_schedule(directory / f"{tag}.schedule.json")
            compiled_us = runtime_replay_us(trace, schedule)
            runs = [anneal(trace, schedule, steps=args.steps, seed=s) for s in range(args.seeds)]
            best = min(runs, key=lambda r: r.iteration_us)
            found = [r.iteration_us for r in runs]
            pred = _predicted(directory / f"{tag}.predicted.json")
            vanilla, pace = pred.get("vanilla"), pred.get("pace")
            # The launch's prediction of `pace` is the compiler's replay at the launch's compute
            # (with --handoff): the best found and the bound are scaled by their ratio to what
            # it replayed on the trace, the units or, where the compiler sent the schedule to
            # the framework's own path, that path.
            path_us = framework_path_us(trace) if schedule.framework else None
            shipped_us = path_us or compiled_us
            best_pred = pace * best.iteration_us / shipped_us if pace else None
            bound_us = lower_bound_us(trace)
            most = vanilla / best_pred if vanilla and best_pred else None
            rows.append(
                [
                    f"{directory.name}/{tag}",
                    len(schedule.units),
                    f"{compiled_us / 1e3:.1f}",
                    f"{best.iteration_us / 1e3:.1f} ({len(best.schedule.units)} units)",
                    f"{min(found) / 1e3:.1f}-{max(found) / 1e3:.1f}",
                    f"{best.iteration_us / compiled_us - 1:+.2%}",
                    f"{bound_us / 1e3:.1f}",
                    f"{vanilla:.1f}" if vanilla else "-",
                    (f"{vanilla / pace:.3f}x" + (" (path)" if path_us else ""))
                    if vanilla and pace
                    else "-",
                    f"{most:.3f}x" if most else "-",
                    f"{vanilla / (pace * bound_us / shipped_us):.3f}x" if vanilla and pace else "-",
                    ("within the model" if most >= GOAL else "beyond the model's best")
                    if most
                    else "-",
                ]
            )
    show_table(
        f"the compiled schedule against the best of {args.seeds} annealing runs of "
        f"{args.steps} steps (replays, ms; the runtime's order)",
        [
            "trace",
            "units",
            "compiled",
            "best found",
            "seeds' range",
            "best vs compiled",
            "LP bound",
            "vanilla predicted",
            "speed-up compiled",
            "speed-up best",
            "speed-up bound",
            f"{GOAL:g}x",
        ],
        rows,
        markdown=args.markdown,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
