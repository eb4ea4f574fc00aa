"""Optimal preemptive all-reduce scheduling (PACE Sec. IV): reduction, exact solver, LP, extraction.

Public entry points:

* :func:`schedule` — ``(trace, plan) -> Schedule``: the compiled, overhead-aware schedule, with
  ``predicted_iteration_us`` the simulator's replay of exactly its units;
* :func:`lower_bound_us` — the zero-overhead optimal preemptive makespan (no fusion, alpha 0);
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
from typing import Any

from pace.errors import InputError
from pace.ir import FusionPlan, Schedule, Trace, Unit
from pace.lp.exact import ExactSolution, solve_exact
from pace.lp.extract import (
    Candidate,
    overhead_aware_candidates,
    replay_us,
    retime_pieces,
    units_from_pieces,
)
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

__all__ = [
    "BACKENDS",
    "DEFAULT_MAX_SLOTS",
    "SOLVERS",
    "Candidate",
    "ExactSolution",
    "LpSolution",
    "Reduction",
    "SlotInstance",
    "best_units",
    "choose_slot_us",
    "lower_bound_us",
    "lp_pieces",
    "reduction",
    "replay_us",
    "schedule",
    "slot_instance",
    "solve_deadline",
    "solve_exact",
    "solve_lp",
    "units_from_pieces",
]

SOLVERS: tuple[str, ...] = ("exact", "lp")

# The simulator replays the few best candidates (by our own fast replay) to pick the winner;
# more would only cost time: the fast replay implements the same semantics.
_SIM_VERIFY = 3


def lower_bound_us(trace: Trace) -> float:
    """Zero-overhead optimal preemptive makespan: no fusion, ``alpha = 0``, free preemption.

    No policy under the replay semantics beats it (every byte still costs ``beta``).

    >>> from pace.synth import random_trace
    >>> t = random_trace(seed=3, n_layers=4, integer=True)
    >>> lower_bound_us(t) >= reduction(t).compute_makespan_us
    True
    """
    red = reduction(trace)
    beta = trace.comm.beta_us_per_byte
    return solve_exact(
        red.release_us,
        beta * red.size_bytes.astype(float),
        red.tail_us,
        compute_makespan_us=red.compute_makespan_us,
    ).makespan_us


def _lp_plan(
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
    solver: str = "exact",
    lp_backend: str = "highs",
    time_limit_s: float = 60.0,
    slot_us: float | None = None,
    max_slots: int = DEFAULT_MAX_SLOTS,
    overhead_aware: bool = True,
) -> tuple[Candidate, list[Candidate], dict[str, Any]]:
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
        pieces, info["lp"] = _lp_plan(
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
        from pace.lp.extract import _candidate, exact_pieces

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
    solver: str = "exact",
    lp_backend: str = "highs",
    time_limit_s: float = 60.0,
    slot_us: float | None = None,
    max_slots: int = DEFAULT_MAX_SLOTS,
    overhead_aware: bool = True,
) -> Schedule:
    """The compiled schedule of ``trace`` under fusion ``plan`` (no fusion if ``None``).

    ``solver="exact"``: largest tail first (optimal for ``alpha = 0``), then the overhead-aware
    search. ``solver="lp"``: the paper's time-slotted LP (``lp_backend`` highs / cbc / scipy;
    slot length ``slot_us`` or automatic with at most ``max_slots`` slots), then the same
    overhead-aware search seeded with the LP's plan instead of the exact one. The winner among
    the candidates is the one the simulator (``pace.sim.simulate``) replays fastest, and
    ``predicted_iteration_us`` is that replay.

    Raises ``InputError`` for a bad trace/plan/option and, for ``solver="lp"``,
    ``InfeasibleError`` / ``SolverTimeoutError`` / ``SolverMissingError``.

    >>> from pace.synth import random_trace
    >>> t = random_trace(seed=7, n_layers=5, integer=True)
    >>> s = schedule(t)
    >>> abs(s.predicted_iteration_us - lower_bound_us(t)) < 1e-6
    True
    """
    from pace.io import trace_digest
    from pace.sim import simulate, units_policy

    t0 = time.perf_counter()
    if not (time_limit_s > 0 and math.isfinite(time_limit_s)):
        raise InputError(f"must be a positive number, got {time_limit_s!r}", field="time_limit_s")
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
    ranked = sorted(cands, key=lambda c: c.replay_us)
    verified: list[tuple[float, int, Candidate, tuple[Unit, ...]]] = []
    seen: set[tuple[Unit, ...]] = set()
    singletons = all(len(job) == 1 for job in red.jobs)
    # Without fusion the fast replay is the simulator's semantics exactly: verify the best only.
    n_verify = 1 if singletons else _SIM_VERIFY
    for pos, cand in enumerate(ranked):
        if len(verified) >= n_verify:
            break
        units = units_from_pieces(red, cand.pieces)
        if units in seen:
            continue
        seen.add(units)
        sim_us = simulate(trace, units_policy(units, name=cand.name)).iteration_us
        verified.append((sim_us, pos, cand, units))
    if singletons and trace.comm.alpha_us > 0:
        # With a per-call latency our preemption choices are heuristic, and P3's fixed-size
        # slices in layer order can win; its own unit list is then a candidate, so the
        # compiled schedule is never worse than it. (FIFO and TicTac orders are candidates
        # already; with alpha = 0 largest tail first is optimal.)
        # Skip the (costly) P3 replay when even a free-preemption bound on it cannot win:
        # every P3 slice pays alpha, so each tensor holds the channel alpha * slices + beta * S.
        from pace.sim.policies import P3_SLICE_BYTES

        slices = -(-red.size_bytes // P3_SLICE_BYTES)
        p3_bound = solve_exact(
            red.release_us,
            trace.comm.alpha_us * slices + trace.comm.beta_us_per_byte * red.size_bytes,
            red.tail_us,
            compute_makespan_us=red.compute_makespan_us,
        ).makespan_us
        best_us = min(v[0] for v in verified)
        p3 = simulate(trace, "p3") if p3_bound < best_us else None
        if p3 is not None and p3.iteration_us < best_us:
            units = tuple(p3.units)
            sim_us = simulate(trace, units_policy(units, name="p3")).iteration_us
            base_cand = Candidate(name="baseline-p3", pieces=(), replay_us=sim_us)
            cands.append(base_cand)
            verified.append((sim_us, len(ranked), base_cand, units))
    predicted, _, chosen, units = min(verified, key=lambda v: (v[0], v[1]))
    info.update(
        {
            "chosen": chosen.name,
            "candidates_us": {c.name: c.replay_us for c in cands},
            "preempted_jobs": _split_jobs(chosen),
            "compile_seconds": time.perf_counter() - t0,
        }
    )
    return Schedule(
        trace_digest=trace_digest(trace),
        cost_model=trace.comm,
        units=units,
        predicted_iteration_us=predicted,
        meta=info,
    )


def _split_jobs(cand: Candidate) -> int:
    counts: dict[int, int] = {}
    for j, _, _ in cand.pieces:
        counts[j] = counts.get(j, 0) + 1
    return sum(1 for c in counts.values() if c > 1)
