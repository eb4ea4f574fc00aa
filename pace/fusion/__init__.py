"""Tensor fusion: which gradient tensors to all-reduce together (PACE Sec. V, and beyond).

Entry point: :func:`plan_fusion` (``Trace -> FusionPlan``). Methods:

``"paper"``
    PACE Alg. 1: chain the all-reduces by ready time, split the chain into the MaxMinSize-balanced
    partition for each group count R, price each with the optimal preemptive scheduler (alpha
    included) and keep the best R (``pace.fusion.paper``).
``"search"`` (default)
    Optimise the oracle's iteration time directly: Alg. 1's best partitions, no fusion and a
    Horovod-like family as seeds, then local search over group boundaries focused on the critical
    blocks of the schedule (``pace.fusion.search``). The best distinct candidates — always
    including no fusion and Alg. 1's choice — are compiled by the real scheduler and replayed by
    the simulator, and the best replayed one wins, so the result is never worse than either under
    the replay; a short descent judged by the replay itself (merge neighbours, shift a boundary)
    then polishes it.
``"none"``
    One group per tensor.

Groups are contiguous on the ready-time chain (Lemma 2) and listed in chain order.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pace.errors import InputError
from pace.fusion.chain import (
    REL_EPS,
    Chain,
    ChainOracle,
    FusionOracle,
    IntArray,
    build_chain,
    partition_key,
)
from pace.fusion.maxmin import max_min_bisect, max_min_dp, max_min_table
from pace.fusion.paper import FULL_ENUMERATION_MAX, RSweep, sweep_r
from pace.fusion.search import PartitionCandidate, SearchResult, search_fusion
from pace.ir import FusionPlan, Trace, Unit
from pace.options import FUSION_METHODS as METHODS
from pace.options import FusionMethod as Method
from pace.options import MaxMinAlgorithm

if TYPE_CHECKING:
    from pace.lp import ScheduleResult

__all__ = [
    "METHODS",
    "Chain",
    "ChainOracle",
    "FusionOutcome",
    "RSweep",
    "SearchResult",
    "build_chain",
    "fuse",
    "max_min_bisect",
    "max_min_dp",
    "max_min_table",
    "plan_fusion",
    "search_fusion",
    "sweep_r",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class FusionOutcome:
    """A plan and, when the search verified it, the exact-solver schedule it was judged by."""

    plan: FusionPlan
    schedule: ScheduleResult | None = None


def plan_fusion(
    trace: Trace,
    *,
    method: Method | str = "search",
    oracle: FusionOracle | None = None,
    maxmin: MaxMinAlgorithm = "auto",
    full_enumeration_max: int = FULL_ENUMERATION_MAX,
    max_evaluations: int | None = None,
    verify_top: int = 3,
    robust: bool | None = None,
    robust_tolerance: float | None = None,
) -> FusionPlan:
    """Partition ``trace``'s tensors into fusion groups (see the module docstring).

    ``oracle(trace, plan) -> iteration_us`` replaces the default price (optimal preemptive
    schedule of the fused reduction); ``maxmin`` picks the MaxMinSize algorithm (``"dp"``: the
    paper's table, ``"bisect"``: binary search, ``"auto"``: DP up to 300 tensors);
    ``full_enumeration_max`` bounds the chain length for which Alg. 1 prices every R;
    ``max_evaluations`` bounds local-search moves; ``verify_top`` is how many of the search's best
    candidates are replayed besides no fusion and Alg. 1's choice. ``robust`` (default off; the
    compile pipeline turns it on) compiles the candidates with ``pace.lp.schedule(robust=...)`` and,
    among the replayed plans nominally within its tolerance of the best (and no worse than no
    fusion and Alg. 1's choice), keeps the one with the best mean jittered replay;
    ``robust_tolerance`` overrides ``pace.lp.ROBUST_TOLERANCE``.

    >>> from pace.synth import random_trace
    >>> trace = random_trace(seed=3, n_layers=6, alpha_us=40.0)
    >>> plan = plan_fusion(trace, method="paper")
    >>> sorted(n for g in plan.groups for n in g) == sorted(t.name for t in trace.tensors)
    True
    """
    return fuse(
        trace,
        method=method,
        oracle=oracle,
        maxmin=maxmin,
        full_enumeration_max=full_enumeration_max,
        max_evaluations=max_evaluations,
        verify_top=verify_top,
        robust=robust,
        robust_tolerance=robust_tolerance,
    ).plan


def fuse(
    trace: Trace,
    *,
    method: Method | str = "search",
    oracle: FusionOracle | None = None,
    maxmin: MaxMinAlgorithm = "auto",
    full_enumeration_max: int = FULL_ENUMERATION_MAX,
    max_evaluations: int | None = None,
    verify_top: int = 3,
    robust: bool | None = None,
    robust_tolerance: float | None = None,
    references: Mapping[str, Sequence[Unit]] | None = None,
) -> FusionOutcome:
    """:func:`plan_fusion`, also returning the verified schedule (saves the compiler a solve).

    ``references``: baselines' unit lists handed to ``pace.lp.schedule`` (the compiler's
    guarantee against them)."""
    if method not in METHODS:
        raise InputError(f"must be one of {', '.join(METHODS)}, got {method!r}", field="method")
    if method == "none":
        return FusionOutcome(plan=FusionPlan.singletons(trace))
    if len(trace.tensors) <= 1:
        plan = FusionPlan.singletons(trace)
        plan = FusionPlan(groups=plan.groups, method=str(method), details={"n_groups": 1})
        sched = (
            _schedule_exact(trace, plan, robust, robust_tolerance, references)
            if method == "search"
            else None
        )
        return FusionOutcome(plan=plan, schedule=sched)
    chain = build_chain(trace)
    cost = ChainOracle(chain=chain, trace=trace, plan_oracle=oracle)
    sweep = sweep_r(chain, cost, maxmin=maxmin, full_enumeration_max=full_enumeration_max)
    paper_details: dict[str, Any] = {
        "paper_groups": sweep.best_groups,
        "paper_oracle_us": sweep.best_cost_us,
        "maxmin": sweep.maxmin,
        "r_priced": len(sweep.costs_us),
    }
    if method == "paper":
        details = {
            **paper_details,
            # R, plus the cuts between dtypes (``Chain.required_starts``).
            "n_groups": int(chain.legal(sweep.best_starts).size),
            "oracle_us": sweep.best_cost_us,
            "oracle_evaluations": cost.evaluations,
        }
        if sweep.best_groups == chain.n:
            # No fusion: keep trace order, exactly what `--no-fusion` schedules.
            groups = FusionPlan.singletons(trace).groups
            return FusionOutcome(plan=FusionPlan(groups=groups, method="paper", details=details))
        return FusionOutcome(plan=chain.plan(sweep.best_starts, method="paper", details=details))

    result = search_fusion(chain, cost, sweep=sweep, max_evaluations=max_evaluations)
    # The oracle ignores what extra preemptions cost in reality; replay the strongest few
    # candidates, plus the two references the search must never lose to.
    paper_label = f"paper(R={sweep.best_groups})"
    chosen = list(result.ranked[:verify_top])
    labels = {c.label for c in chosen}
    for ref in result.ranked:
        if ref.label in ("none", paper_label) and ref.label not in labels:
            chosen.append(ref)
            labels.add(ref.label)
    # Without fusion the default oracle is a lower bound on the replay of any schedule (every
    # tensor still occupies the channel alpha + beta * bytes in total, and its consumers wait for
    # all of it), so a candidate whose oracle value is no better than the best replay so far
    # cannot win and is not compiled: branch and bound, which skips e.g. the costly unfused
    # schedule of a long chain. For a fused plan the bound is not strict (the scheduler may let a
    # member finish before its group), so Alg. 1's choice, which the search must never lose to,
    # is always compiled; other skipped candidates were only chances to improve.
    bounded = oracle is None
    from pace.lp import ROBUST_FULL_MAX_JOBS

    # Long chains: compile the candidates nominally and only the winner robustly (compile time).
    per_candidate = chain.n <= ROBUST_FULL_MAX_JOBS
    chosen.sort(key=lambda c: c.cost_us)
    replayed: dict[str, float] = {}
    skipped: list[str] = []
    verified: list[tuple[float, int, FusionPlan, ScheduleResult]] = []
    for rank, cand in enumerate(chosen):
        if (
            bounded
            and verified
            and cand.label != paper_label
            and cand.cost_us >= min(v[0] for v in verified)
        ):
            skipped.append(cand.label)
            continue
        if cand.starts.size == chain.n:
            # No fusion exactly as `--no-fusion` compiles it (trace order): the scheduler breaks
            # ties by job order, and the guarantee is "never worse than that".
            plan = FusionPlan.singletons(trace)
        else:
            plan = chain.plan(cand.starts, method="search", details={})
        sched = _schedule_exact(trace, plan, robust and per_candidate, robust_tolerance, references)
        replayed[cand.label] = sched.predicted_iteration_us
        verified.append((sched.predicted_iteration_us, rank, plan, sched))
    polished, better = _polish(
        chain,
        verified=[(us, chosen[rank].starts) for us, rank, _, _ in verified],
        compile_plan=lambda plan: _schedule_exact(trace, plan, False, None, references),
    )
    replayed.update(polished)
    if better is not None:
        starts, plan, sched = better
        if robust and per_candidate:  # the polish compiled it nominally
            sched = _schedule_exact(trace, plan, True, robust_tolerance, references)
        chosen.append(PartitionCandidate(label="polish", starts=starts, cost_us=cost(starts)))
        verified.append((sched.predicted_iteration_us, len(chosen) - 1, plan, sched))
    # Ties keep the oracle's ranking.
    best_us, best_rank, best_plan, best_schedule = min(verified, key=lambda v: (v[0], v[1]))
    if best_schedule.robust is not None:
        from pace.lp import ROBUST_TOLERANCE, select_robust
        from pace.lp.robust import RobustOption

        tol = ROBUST_TOLERANCE if robust_tolerance is None else robust_tolerance
        # Nominally within the tolerance of the best NOMINAL schedule of any plan (each robust
        # schedule may itself sit up to `tol` above its plan's nominal best, and the two must
        # not compound), and never worse than the two references (a skipped reference's oracle
        # value is a lower bound on its replay).
        best_nominal_us = min(
            sched.robust.nominal_choice_us if sched.robust is not None else us
            for us, _, _, sched in verified
        )
        limit = best_nominal_us * (1.0 + tol)
        for cand in chosen:
            if cand.label in ("none", paper_label):
                ref_us = replayed.get(cand.label, cand.cost_us)
                limit = min(limit, ref_us)
        limit = max(limit, best_us)
        options = {
            rank: RobustOption(
                nominal_us=us,
                mean_us=functools.partial(float, sched.robust.jitter_mean_us),
                rank=rank,
                payload=rank,
            )
            for us, rank, _, sched in verified
            if sched.robust is not None
        }
        pick, _ = select_robust(options[best_rank], list(options.values()), limit)
        best_rank = pick.payload
        _, _, best_plan, best_schedule = next(v for v in verified if v[1] == best_rank)
    elif robust and not per_candidate:
        refs = [us for us, rank, _, _ in verified if chosen[rank].label in ("none", paper_label)]
        again = _schedule_exact(trace, best_plan, True, robust_tolerance, references)
        # Keep the guarantee against the references (their replays were nominal).
        if again.predicted_iteration_us <= min(refs, default=math.inf):
            best_schedule = again
    best_cand = chosen[best_rank]
    details = {
        **paper_details,
        "n_groups": len(best_plan.groups),
        "oracle_us": best_cand.cost_us,
        "oracle_evaluations": cost.evaluations,
        "chosen": best_cand.label,
        "replayed_us": replayed,
        "skipped_by_bound": skipped,
    }
    plan = FusionPlan(groups=best_plan.groups, method="search", details=details)
    return FusionOutcome(plan=plan, schedule=best_schedule)


POLISH_BUDGET = 24
"""Plans the replay polish compiles at most (each one exact schedule and replay)."""


def _polish_moves(starts: IntArray, n: int) -> list[IntArray]:
    """Partitions one move from ``starts``: merge a group into its predecessor, or shift a
    boundary by one tensor; urgent end (the chain's last tensors) first."""
    out: list[IntArray] = []
    cuts = starts.tolist()
    for i in range(len(cuts) - 1, 0, -1):
        out.append(np.asarray([*cuts[:i], *cuts[i + 1 :]], dtype=np.int64))
        for q in (cuts[i] + 1, cuts[i] - 1):
            lo = cuts[i - 1]
            hi = cuts[i + 1] if i + 1 < len(cuts) else n
            if lo < q < hi:
                out.append(np.asarray([*cuts[:i], q, *cuts[i + 1 :]], dtype=np.int64))
    return out


def _polish(
    chain: Chain,
    *,
    verified: list[tuple[float, IntArray]],
    compile_plan: Callable[[FusionPlan], ScheduleResult],
) -> tuple[dict[str, float], tuple[IntArray, FusionPlan, ScheduleResult] | None]:
    """First-improvement descents judged by the replay itself (``compile_plan``: the nominal
    exact schedule), from each replayed partition in ``verified`` (``(replayed us, starts)``),
    best first, at most ``POLISH_BUDGET`` plans compiled in all.

    The oracle prices a partition by the optimal preemptive schedule of its fused jobs and
    misses what the replay charges (preemptions cost alpha each), so it can rank a plan above
    a neighbour that replays faster. Two traces hypothesis found, where the overlapped compile
    replayed slower than the sync compile: three groups at 5496 us where merging the two
    urgent ones replays 5466 us; no fusion at 19211 us where one group, a merge away from
    Alg. 1's R=2 choice, replays 19200 us. Returns the replayed time of every plan compiled,
    by label, and the best partition found (with its plan and nominal schedule) if it beats every
    one in ``verified``.
    """
    seen = {partition_key(starts) for _, starts in verified}
    best_us = min(us for us, _ in verified)
    better: tuple[IntArray, FusionPlan, ScheduleResult] | None = None
    replayed: dict[str, float] = {}
    for start_us, start in sorted(verified, key=lambda v: v[0]):
        current_us, current = start_us, start
        improved = True
        while improved and len(replayed) < POLISH_BUDGET:
            improved = False
            for move in _polish_moves(current, chain.n):
                if len(replayed) >= POLISH_BUDGET:
                    break
                starts = chain.legal(move)  # a merge across dtypes is no move
                key = partition_key(starts)
                if key in seen:
                    continue
                seen.add(key)
                plan = chain.plan(starts, method="search", details={})
                sched = compile_plan(plan)
                us = sched.predicted_iteration_us
                replayed[f"polish({len(replayed) + 1})"] = us
                if us < best_us * (1.0 - REL_EPS):
                    best_us, better = us, (starts, plan, sched)
                if us < current_us * (1.0 - REL_EPS):
                    current_us, current = us, starts
                    improved = True
                    break
    return replayed, better


def _schedule_exact(
    trace: Trace,
    plan: FusionPlan,
    robust: bool | None,
    robust_tolerance: float | None,
    references: Mapping[str, Sequence[Unit]] | None,
) -> ScheduleResult:
    from pace.lp import ROBUST_TOLERANCE, schedule

    return schedule(
        trace,
        plan,
        solver="exact",
        robust=bool(robust),
        robust_tolerance=ROBUST_TOLERANCE if robust_tolerance is None else robust_tolerance,
        references=references,
    )
