"""Optimal preemptive all-reduce scheduling (PACE Sec. IV): reduction, exact solver, LP, extraction.

Public entry points:

* :func:`schedule` — ``(trace, plan) -> Schedule``: the compiled, overhead-aware schedule, with
  ``predicted_iteration_us`` the simulator's replay of exactly its units;
* :func:`lower_bound_us` — the zero-overhead optimal preemptive makespan (no fusion, alpha 0),
  raised to :func:`interference_bound_us` where the trace's interference term makes it higher;
* :func:`best_units` — the same search as :func:`schedule` without the simulator check, for
  callers that need a fast oracle (the fusion search);
* building blocks: :func:`reduction`, :func:`solve_exact`, :func:`solve_lp`.

The LP backends raise :class:`~pace.errors.InfeasibleError`,
:class:`~pace.errors.SolverTimeoutError` or :class:`~pace.errors.SolverMissingError`; the
compile pipeline falls back to ``solver="exact"`` on any :class:`~pace.errors.SolverError`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pace.analysis import analyze
from pace.errors import InputError
from pace.ir import MAX_COMPUTE_LOSS, FusionPlan, Schedule, Trace, Unit
from pace.lp.candidates import (
    PieceCandidate,
    grace_candidates,
    interfering,
    overhead_aware_candidates,
    replay_us,
    retime_pieces,
    units_bound_us,
)
from pace.lp.exact import ExactSolution, solve_exact
from pace.lp.model import (
    BACKENDS,
    DEFAULT_MAX_SLOTS,
    LpSolution,
    SlotInstance,
    choose_slot_us,
    lp_pieces,
    slot_instance,
    solve_deadline,
    solve_lp,
)
from pace.lp.reduction import Reduction, reduction
from pace.lp.robust import (
    ROBUST_FULL_MAX_JOBS,
    ROBUST_SAMPLES,
    ROBUST_SD,
    ROBUST_TOLERANCE,
    JitterWorlds,
    RobustChoice,
    jitter_worlds,
    jittered_replays_us,
    robust_choice,
    select_robust,
)
from pace.lp.units import units_from_pieces
from pace.options import SOLVERS, Solver

__all__ = [
    "BACKENDS",
    "DEFAULT_MAX_SLOTS",
    "ROBUST_DEFAULT",
    "ROBUST_FULL_MAX_JOBS",
    "ROBUST_SAMPLES",
    "ROBUST_SD",
    "ROBUST_TOLERANCE",
    "SOLVERS",
    "ExactSolution",
    "JitterWorlds",
    "LpSolution",
    "PieceCandidate",
    "Reduction",
    "RobustChoice",
    "ScheduleResult",
    "SlotInstance",
    "best_units",
    "choose_slot_us",
    "interference_bound_us",
    "jitter_worlds",
    "jittered_replays_us",
    "lower_bound_us",
    "lp_pieces",
    "reduction",
    "replay_us",
    "schedule",
    "select_robust",
    "slot_instance",
    "solve_deadline",
    "solve_exact",
    "solve_lp",
    "units_from_pieces",
]


# The simulator replays the few best candidates (by our own fast replay) to pick the winner;
# more would only cost time: the fast replay implements the same semantics.
_SIM_VERIFY = 3
# Candidates replayed by the interference-aware simulator when the trace has that term.
_INTERFERENCE_VERIFY = 8

ROBUST_DEFAULT = True
"""Whether the compile pipeline (``pace.compiler.compile_trace``, ``pace compile``) picks
candidates robust to jitter by default (``docs/scheduling.md``, "Robustness to jitter", has the
measurements behind it). :func:`schedule` itself defaults to the nominal optimum."""

# Grace ladder of the robust candidates (fraction of each job's release time), and the slice
# ladder (longest job / d) applied to each.
_GRACE_FRACTIONS = (0.0, 0.0025, 0.005, 0.01, 0.02)
_SLICE_DIVISORS = (2, 4, 8, 16, 32)
_GRACE_FRACTIONS_LARGE = (0.005, 0.02)
_SLICE_DIVISORS_LARGE = (4, 16)


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleResult:
    """What :func:`schedule` decided: the schedule, the candidate it ships, every candidate's
    job-level replay, and the robust selection's choice (``None`` when it did not run).
    ``schedule.meta`` carries the same facts for the schedule file."""

    schedule: Schedule
    chosen: str
    candidates_us: Mapping[str, float]
    robust: RobustChoice | None

    @property
    def predicted_iteration_us(self) -> float:
        return self.schedule.predicted_iteration_us


def lower_bound_us(trace: Trace) -> float:
    """Zero-overhead optimal preemptive makespan: no fusion, ``alpha = 0``, free preemption;
    with an interference term, at least :func:`interference_bound_us`.

    No policy under the replay semantics beats it (every byte still costs ``beta``).

    >>> from pace.synth import random_trace
    >>> t = random_trace(seed=3, n_layers=4, integer=True)
    >>> lower_bound_us(t) >= reduction(t).compute_makespan_us
    True
    """
    red = reduction(trace)
    beta = trace.comm.beta_us_per_byte
    preemptive = solve_exact(
        red.release_us,
        beta * red.size_bytes.astype(float),
        red.tail_us,
        compute_makespan_us=red.compute_makespan_us,
    ).makespan_us
    return max(preemptive, interference_bound_us(trace))


def interference_bound_us(trace: Trace) -> float:
    """What no policy beats once communication slows the compute beside it (0 without a term).

    Under the replay semantics (``pace.ir.Interference``) compute progresses at ``1 - min(cap,
    idle_loss + loss of the calls in flight)`` of its speed, and a call moving bytes at rate
    ``r`` costs the compute beside it at least ``us_per_byte * r`` of progress, while no call
    moves bytes faster than ``1 / beta``. So, with ``i = min(cap, idle_loss)``, every us of
    progress takes ``1 / (1 - i)`` us, and every byte either moves beside compute (losing at
    least ``min((cap - i) * beta, us_per_byte)`` of progress) or while nothing computes (at
    least ``beta`` of the window's time):

        critical_path / (1 - i) + bytes * min(min((cap - i) * beta, us_per_byte) / (1 - i), beta)

    It ignores the per-call terms and the slower calls beside compute, and holds for any
    fusion, order, credit or preemption. Where compute dominates, it is the bound that the
    zero-overhead makespan (which is the critical path there) no longer is.
    """
    term = trace.comm.interference
    if term is None or not term.active:
        return 0.0
    an = analyze(trace)  # cached: lower_bound_us's reduction was built from the same analysis
    idle = min(MAX_COMPUTE_LOSS, max(0.0, term.idle_loss))
    beta = trace.comm.beta_us_per_byte
    per_byte_us = min(min((MAX_COMPUTE_LOSS - idle) * beta, term.us_per_byte) / (1.0 - idle), beta)
    total_bytes = float(sum(an.size_bytes))
    return float(an.critical_path_us / (1.0 - idle) + total_bytes * per_byte_us)


def _lp_pieces(
    red: Reduction,
    *,
    lp_backend: str,
    time_limit_s: float,
    slot_us: float | None,
    max_slots: int,
) -> tuple[tuple[tuple[int, float, float], ...], dict[str, Any]]:
    slot = slot_us if slot_us is not None else choose_slot_us(red, max_slots=max_slots)
    inst = slot_instance(red, slot_us=slot)
    sol = solve_lp(inst, backend=lp_backend, time_limit_s=time_limit_s)
    info = {
        "backend": lp_backend,
        "slot_us": slot,
        "makespan_slots": sol.makespan_slots,
        "makespan_us": sol.makespan_us,
        "integral": sol.integral,
        "max_fractionality": sol.max_fractionality,
        "solves": sol.solves,
        "variables": sol.variables,
        "slot_variables": sol.slot_variables,
        "solve_seconds": sol.solve_seconds,
    }
    return lp_pieces(inst, sol), info


def best_units(
    trace: Trace,
    plan: FusionPlan | None = None,
    *,
    solver: Solver = "exact",
    lp_backend: str = "highs",
    time_limit_s: float = 60.0,
    slot_us: float | None = None,
    max_slots: int = DEFAULT_MAX_SLOTS,
    overhead_aware: bool = True,
) -> tuple[PieceCandidate, list[PieceCandidate], dict[str, Any]]:
    """The best candidate by the fast replay, every candidate, and solver info.

    ``overhead_aware=False`` returns the solver's own plan only (the LP's, or largest tail
    first), split exactly where the solver preempts.
    """
    if solver not in SOLVERS:
        raise InputError(f"must be one of {', '.join(SOLVERS)}, got {solver!r}", field="solver")
    red = reduction(trace, plan)
    comm = trace.comm
    info: dict[str, Any] = {"solver": solver, "jobs": red.n_jobs}
    base: list[tuple[str, tuple[tuple[int, float, float], ...]]] = []
    if solver == "lp":
        pieces, info["lp"] = _lp_pieces(
            red,
            lp_backend=lp_backend,
            time_limit_s=time_limit_s,
            slot_us=slot_us,
            max_slots=max_slots,
        )
        base.append(("lp", retime_pieces(red, comm, pieces)))
    if overhead_aware:
        cands = overhead_aware_candidates(red, comm, base=base, include_exact=solver == "exact")
    else:
        from pace.lp.candidates import _candidate, exact_pieces

        if not base:
            base.append(("exact", exact_pieces(red, comm)))
        cands = [_candidate(red, comm, name, p) for name, p in base]
    # With no per-call latency, Horn's value for single-call jobs bounds every schedule of
    # this plan (each job occupies the channel at least alpha + beta * bytes in total).
    info["plan_bound_us"] = solve_exact(
        red.release_us,
        red.duration_us,
        red.tail_us,
        compute_makespan_us=red.compute_makespan_us,
    ).makespan_us
    best = min(cands, key=lambda c: c.replay_us)
    return best, cands, info


def schedule(
    trace: Trace,
    plan: FusionPlan | None = None,
    *,
    solver: Solver = "exact",
    lp_backend: str = "highs",
    time_limit_s: float = 60.0,
    slot_us: float | None = None,
    max_slots: int = DEFAULT_MAX_SLOTS,
    overhead_aware: bool = True,
    robust: bool = False,
    robust_samples: int = ROBUST_SAMPLES,
    robust_sd: float = ROBUST_SD,
    robust_tolerance: float = ROBUST_TOLERANCE,
    references: Mapping[str, Sequence[Unit]] | None = None,
) -> ScheduleResult:
    """The compiled schedule of ``trace`` under fusion ``plan`` (no fusion if ``None``).

    ``solver="exact"``: largest tail first (optimal for ``alpha = 0``), then the overhead-aware
    search. ``solver="lp"``: the paper's time-slotted LP (``lp_backend`` highs / cbc / scipy;
    slot length ``slot_us`` or automatic with at most ``max_slots`` slots), then the same
    overhead-aware search seeded with the LP's plan instead of the exact one. The winner among
    the candidates is the one the contract's replay (``pace.replay``) finishes first, and
    ``predicted_iteration_us`` is that replay.

    ``robust=True``: also consider candidates with slack at their preemption points, and among
    the candidates whose nominal replay is within ``robust_tolerance`` (relative) of the best one
    — and no worse than the FIFO, need-order (TicTac) and P3 candidates — take the one with the
    best mean replay over ``robust_samples`` jittered copies of the trace (op durations times
    lognormal factors with log-sd ``robust_sd``, fixed seed; :mod:`pace.lp.robust`).
    ``predicted_iteration_us`` is still the nominal replay of exactly the chosen units;
    ``ScheduleResult.robust`` (and ``meta["robust"]``) records both choices' nominal and
    jittered values.

    ``references``: baselines' own unit lists the schedule must not lose to (the compiler's
    ``reference_units``: P3's); without fusion and with a per-call latency each is a candidate
    and bounds the robust choice.

    Raises ``InputError`` for a bad trace/plan/option and, for ``solver="lp"``,
    ``InfeasibleError`` / ``SolverTimeoutError`` / ``SolverMissingError``.

    >>> from pace.synth import random_trace
    >>> t = random_trace(seed=7, n_layers=5, integer=True)
    >>> s = schedule(t).schedule
    >>> abs(s.predicted_iteration_us - lower_bound_us(t)) < 1e-6
    True
    """
    from pace.io import trace_digest

    t0 = time.perf_counter()
    if not (time_limit_s > 0 and math.isfinite(time_limit_s)):
        raise InputError(f"must be a positive number, got {time_limit_s!r}", field="time_limit_s")
    if robust_samples < 1:
        raise InputError(f"must be >= 1, got {robust_samples!r}", field="robust_samples")
    if not (0 <= robust_tolerance < 1):
        raise InputError(f"must be in [0, 1), got {robust_tolerance!r}", field="robust_tolerance")
    _, cands, info = best_units(
        trace,
        plan,
        solver=solver,
        lp_backend=lp_backend,
        time_limit_s=time_limit_s,
        slot_us=slot_us,
        max_slots=max_slots,
        overhead_aware=overhead_aware,
    )
    red = reduction(trace, plan)
    if robust and overhead_aware:
        ladder: tuple[tuple[float, ...], tuple[int, ...]]
        if red.n_jobs <= ROBUST_FULL_MAX_JOBS:
            ladder = (_GRACE_FRACTIONS, _SLICE_DIVISORS)
        else:
            ladder = (_GRACE_FRACTIONS_LARGE, _SLICE_DIVISORS_LARGE)
        cands.extend(grace_candidates(red, trace.comm, *ladder))
    ranked = sorted(cands, key=lambda c: c.replay_us)
    verified: list[tuple[float, int, PieceCandidate, tuple[Unit, ...]]] = []
    seen: set[tuple[Unit, ...]] = set()
    singletons = all(len(job) == 1 for job in red.jobs)
    # Without fusion the fast replay is the simulator's semantics exactly: verify the best only.
    # With interference the job-level scores ignore it: replay more of the best by the true one.
    n_verify = _INTERFERENCE_VERIFY if interfering(red) else (1 if singletons else _SIM_VERIFY)
    for pos, cand in enumerate(ranked):
        if len(verified) >= n_verify:
            break
        units = units_from_pieces(red, cand.pieces)
        if units in seen:
            continue
        seen.add(units)
        verified.append((replay_us(red, units), pos, cand, units))
    ref_us = math.inf
    ref_units: tuple[Unit, ...] = ()
    ref_name = ""
    if singletons and (trace.comm.alpha_us > 0 or robust):
        # With a per-call latency our preemption choices are heuristic, and a baseline's own
        # unit list (the compiler hands them in: P3's fixed-size slices in layer order) can
        # win; it is then a candidate. (FIFO and TicTac orders are candidates already; with
        # alpha = 0 largest tail first is optimal, but a robust choice may cost up to the
        # tolerance above it, so the references bound that choice then too.)
        best_us = min(v[0] for v in verified)
        # A robust choice may cost up to the tolerance: it must not lose to one either.
        reach_us = best_us * (1.0 + robust_tolerance) if robust else best_us
        for name, given in (references or {}).items():
            units = tuple(given)
            # Skip the (costly) replay when even a free-preemption bound cannot win: every
            # unit pays alpha, so each tensor holds the channel alpha * units + beta * S.
            if units_bound_us(red, trace.comm, units) >= reach_us:
                continue
            us = replay_us(red, units)
            if us < ref_us:
                ref_us, ref_units, ref_name = us, units, name
            if us < best_us:
                base_cand = PieceCandidate(name=f"baseline-{name}", pieces=(), replay_us=us)
                cands.append(base_cand)
                verified.append((us, len(ranked), base_cand, units))
    predicted, _, chosen, units = min(verified, key=lambda v: (v[0], v[1]))
    chosen_robust: RobustChoice | None = None
    if robust:
        worlds = jitter_worlds(trace, samples=robust_samples, sd=robust_sd)
        predicted, chosen, units, chosen_robust = robust_choice(
            red,
            cands,
            worlds,
            (predicted, chosen, units),
            robust_tolerance,
            (ref_us, ref_units, ref_name),
        )
        info["robust"] = chosen_robust.as_meta()
    info.update(
        {
            "chosen": chosen.name,
            "candidates_us": {c.name: c.replay_us for c in cands},
            "preempted_jobs": _split_jobs(chosen),
            "compile_seconds": time.perf_counter() - t0,
        }
    )
    sched = Schedule(
        trace_digest=trace_digest(trace),
        cost_model=trace.comm,
        units=units,
        predicted_iteration_us=predicted,
        meta=info,
    )
    return ScheduleResult(
        schedule=sched,
        chosen=chosen.name,
        candidates_us=info["candidates_us"],
        robust=chosen_robust,
    )


def _split_jobs(cand: PieceCandidate) -> int:
    counts: dict[int, int] = {}
    for j, _, _ in cand.pieces:
        counts[j] = counts.get(j, 0) + 1
    return sum(1 for c in counts.values() if c > 1)
