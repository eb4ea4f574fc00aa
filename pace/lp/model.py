"""The time-slotted LP of PACE Sec. IV-B, in a numerically sound form, with three backends.

Variables ``x_i(t)`` in [0, 1]: all-reduce job ``i`` runs in slot ``t`` (slot ``t`` covers
``[t, t+1)`` slot lengths). The paper's constraints:

* (3) ``sum_t x_i(t) = p_i`` — enough slots for the job (``p_i = ceil(g_i / slot)``),
* (6) ``sum_i x_i(t) <= 1`` — one all-reduce per slot,
* (7) ``x_i(t) = 0`` for ``t < r_i`` — not before the producer finishes,

and the objective (10): minimise ``max_{i,t} (t x_i(t) + q_i)`` (Theorem 1; plus the
compute-only makespan, a constant). The paper linearises it as (14) with coefficients
``(TN)^(t + L_i)``; with ``T N`` in the thousands and exponents in the thousands those numbers are
around ``10^10000`` — far past the largest double (``1.8 * 10^308``), so (14) cannot even be
written down for a real model (see docs/scheduling.md).

**What we solve instead (exactly equivalent).** The makespan is at most ``D`` iff every job
``i`` finishes by ``D - q_i``: a *deadline-indexed feasibility LP* where ``x_i(t)`` exists only
for ``r_i <= t < D - q_i``. Its matrix is that of a bipartite transportation problem (jobs ×
slots, one 1 per column in each of the two row groups), so it is totally unimodular like the
paper's (Theorem 2) and every vertex is integral. The optimum ``D*`` is the smallest feasible
``D`` (feasibility is monotone in ``D``): found by bisection between the lower bound
``max(compute, max_i r_i + p_i + q_i)`` and a trivially feasible upper bound, or certified by two
solves (``D*`` feasible, ``D* - 1`` infeasible) when a hint is given. Among the feasible
schedules at ``D*`` the LP minimises ``sum_i w_i t x_i(t)`` with weights decreasing in deadline
order: an exchange argument shows its optimum is the slotted largest-tail-first schedule, so it is
also well formed (no needless alternation between jobs) for extraction. Coefficients stay below
``2 T``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from pace.errors import InfeasibleError, SolverMissingError, SolverTimeoutError
from pace.lp.exact import solve_exact
from pace.lp.reduction import Reduction

IntArray = npt.NDArray[np.int64]
Backend = Literal["highs", "cbc", "scipy"]
BACKENDS: tuple[str, ...] = ("highs", "cbc", "scipy")

DEFAULT_MAX_SLOTS = 1000
"""Default cap on the slotted horizon; the LP has up to (jobs × slots) variables."""

_INTEGRALITY_TOL = 1e-6


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class SlotInstance:
    """A reduction rounded to whole slots of ``slot_us`` (every quantity rounded up)."""

    slot_us: float
    release: IntArray
    duration: IntArray
    tail: IntArray
    compute: int

    @property
    def n_jobs(self) -> int:
        return len(self.release)

    @property
    def lower_bound(self) -> int:
        """``max(compute, max_i r_i + p_i + q_i)``: no schedule is shorter."""
        if self.n_jobs == 0:
            return self.compute
        return max(self.compute, int((self.release + self.duration + self.tail).max()))

    @property
    def trivial_upper_bound(self) -> int:
        """All jobs back to back after the last release: always feasible."""
        if self.n_jobs == 0:
            return self.compute
        return max(
            self.compute,
            int(self.release.max() + self.duration.sum() + self.tail.max()),
        )


def _ceil_slots(values_us: npt.NDArray[np.float64], slot_us: float) -> IntArray:
    # Up to float noise: 3.0000000001 slots is 3 slots, not 4.
    v = np.asarray(values_us, dtype=np.float64) / slot_us
    return np.ceil(v - 1e-9 * np.maximum(1.0, np.abs(v))).astype(np.int64)


def choose_slot_us(red: Reduction, *, max_slots: int = DEFAULT_MAX_SLOTS) -> float:
    """The paper's rule (a slot no longer than the shortest all-reduce), capped at ``max_slots``.

    The horizon is estimated by the non-preemptive largest-tail-first makespan (an upper bound of
    the optimum). When the cap binds, slots are longer than the shortest all-reduce and the
    rounding error grows; docs/scheduling.md bounds it.
    """
    durations = red.duration_us[red.duration_us > 0]
    shortest = float(durations.min()) if durations.size else 1.0
    horizon = solve_exact(
        red.release_us,
        red.duration_us,
        red.tail_us,
        compute_makespan_us=red.compute_makespan_us,
        min_remaining_us=math.inf,
    ).makespan_us
    if horizon <= 0:
        return shortest
    return max(shortest, horizon / max_slots)


def slot_instance(red: Reduction, *, slot_us: float) -> SlotInstance:
    """Round ``red`` to slots of ``slot_us``: releases, durations, tails, compute all rounded up.

    Rounding up makes the slotted optimum (times ``slot_us``) an upper bound of the continuous
    one, and at most ``(N + 3) * slot_us`` above it (docs/scheduling.md).
    """
    if not (slot_us > 0 and math.isfinite(slot_us)):
        raise ValueError(f"slot_us must be a positive number, got {slot_us!r}")
    duration = np.maximum(_ceil_slots(red.duration_us, slot_us), 1)
    return SlotInstance(
        slot_us=slot_us,
        release=_ceil_slots(red.release_us, slot_us),
        duration=duration,
        tail=_ceil_slots(red.tail_us, slot_us),
        compute=int(_ceil_slots(np.array([red.compute_makespan_us]), slot_us)[0]),
    )


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class LpSolution:
    """The LP's optimum ``makespan_slots`` and the slot assignment achieving it.

    ``assignment`` lists ``(job, slot, value)`` with value > 0. The optimum is always proved:
    ``history`` holds the horizons tried and whether each was feasible, and
    ``makespan_slots - 1`` is infeasible there or below the lower bound.
    ``max_fractionality`` is the largest distance of any ``x`` from 0 or 1 (0 for a vertex
    solution, as total unimodularity promises).
    """

    makespan_slots: int
    slot_us: float
    assignment: tuple[tuple[int, int, float], ...]
    integral: bool
    max_fractionality: float
    backend: str
    solves: int
    variables: int
    solve_seconds: float
    history: tuple[tuple[int, bool], ...] = field(default=())

    @property
    def makespan_us(self) -> float:
        return self.makespan_slots * self.slot_us


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class _Built:
    job: IntArray
    slot: IntArray
    cost: npt.NDArray[np.float64]
    n_slots: int


def _build(inst: SlotInstance, deadline: int) -> _Built | None:
    """Variables of the deadline-``deadline`` LP, or ``None`` if a window is too short."""
    n = inst.n_jobs
    lo = inst.release
    hi = deadline - inst.tail
    length = hi - lo
    if n and (length < inst.duration).any():
        return None
    # Weights strictly decreasing in (deadline, release, index) order: the exchange argument in
    # the module docstring needs them distinct.
    rank = np.lexsort((np.arange(n), lo, hi))
    weight = np.empty(n, dtype=np.float64)
    weight[rank] = 2.0 - np.arange(n, dtype=np.float64) / max(n, 1)
    counts = np.maximum(length, 0)
    job = np.repeat(np.arange(n, dtype=np.int64), counts)
    starts = np.repeat(lo - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
    slot = np.arange(job.size, dtype=np.int64) + starts
    cost = (slot.astype(np.float64) + 1.0) * weight[job]
    return _Built(job=job, slot=slot, cost=cost, n_slots=int(deadline))


def _solve_scipy(
    inst: SlotInstance, b: _Built, time_limit_s: float
) -> npt.NDArray[np.float64] | None:
    try:
        from scipy.optimize import linprog
        from scipy.sparse import csr_array
    except ImportError as exc:  # pragma: no cover - scipy is a core dependency
        raise SolverMissingError("scipy is not installed") from exc
    nv = b.job.size
    cols = np.arange(nv)
    ones = np.ones(nv)
    a_eq = csr_array((ones, (b.job, cols)), shape=(inst.n_jobs, nv))
    # Only slots that some variable uses get a row (6).
    used, slot_row = np.unique(b.slot, return_inverse=True)
    a_ub = csr_array((ones, (slot_row, cols)), shape=(used.size, nv))
    res = linprog(
        b.cost,
        A_ub=a_ub,
        b_ub=np.ones(used.size),
        A_eq=a_eq,
        b_eq=inst.duration.astype(np.float64),
        bounds=(0.0, 1.0),
        method="highs",
        options={"time_limit": max(time_limit_s, 1e-3), "presolve": True},
    )
    if res.status == 0:
        return np.asarray(res.x, dtype=np.float64)
    if res.status == 2:
        return None
    if res.status == 1:
        raise SolverTimeoutError(f"scipy linprog (HiGHS) hit its limit: {res.message}")
    raise InfeasibleError(f"scipy linprog (HiGHS) failed: status {res.status}: {res.message}")


def _pulp_solver(backend: str, time_limit_s: float) -> Any:
    try:
        import pulp
    except ImportError as exc:
        raise SolverMissingError("pulp is not installed") from exc
    tl = max(time_limit_s, 1e-3)
    if backend == "highs":
        solver = pulp.HiGHS(msg=False, timeLimit=tl)
        if not solver.available():
            raise SolverMissingError("pulp's HiGHS backend needs highspy, which is not installed")
        return solver
    solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(1, math.ceil(tl)))
    if not solver.available():
        raise SolverMissingError("pulp's CBC binary is not available")
    return solver


def _solve_pulp(
    inst: SlotInstance, b: _Built, backend: str, time_limit_s: float
) -> npt.NDArray[np.float64] | None:
    import pulp

    solver = _pulp_solver(backend, time_limit_s)
    prob = pulp.LpProblem("pace_deadline_lp", pulp.LpMinimize)
    xs = [
        pulp.LpVariable(f"x_{j}_{t}", 0, 1)
        for j, t in zip(b.job.tolist(), b.slot.tolist(), strict=True)
    ]
    prob += pulp.LpAffineExpression(zip(xs, b.cost.tolist(), strict=True))
    by_job: list[list[Any]] = [[] for _ in range(inst.n_jobs)]
    by_slot: dict[int, list[Any]] = {}
    for v, (j, t) in enumerate(zip(b.job.tolist(), b.slot.tolist(), strict=True)):
        by_job[j].append(xs[v])
        by_slot.setdefault(t, []).append(xs[v])
    for j, vs in enumerate(by_job):  # (3)
        prob += pulp.LpAffineExpression([(x, 1.0) for x in vs]) == int(inst.duration[j])
    for vs in by_slot.values():  # (6)
        if len(vs) > 1:
            prob += pulp.LpAffineExpression([(x, 1.0) for x in vs]) <= 1
    prob.solve(solver)
    if backend == "highs":
        import highspy

        status = prob.solverModel.getModelStatus()
        hs = highspy.HighsModelStatus
        if status == hs.kOptimal:
            pass
        elif status in (hs.kInfeasible, hs.kUnboundedOrInfeasible):
            return None
        elif status in (hs.kTimeLimit, hs.kIterationLimit, hs.kInterrupt):
            raise SolverTimeoutError(f"HiGHS hit its time limit ({time_limit_s:.3g} s)")
        else:
            raise InfeasibleError(f"HiGHS failed: {prob.solverModel.modelStatusToString(status)}")
    else:
        if prob.status == pulp.LpStatusInfeasible:
            return None
        if prob.status != pulp.LpStatusOptimal or prob.sol_status != pulp.LpSolutionOptimal:
            if prob.status == pulp.LpStatusNotSolved or prob.sol_status in (
                pulp.LpSolutionIntegerFeasible,
                pulp.LpSolutionNoSolutionFound,
            ):
                raise SolverTimeoutError(f"CBC stopped before optimality ({time_limit_s:.3g} s)")
            raise InfeasibleError(f"CBC failed: {pulp.LpStatus[prob.status]}")
    return np.array([x.varValue or 0.0 for x in xs], dtype=np.float64)


def solve_deadline(
    inst: SlotInstance,
    deadline_slots: int,
    *,
    backend: str = "highs",
    time_limit_s: float = 60.0,
) -> tuple[tuple[int, int, float], ...]:
    """The assignment of the deadline LP at ``deadline_slots``; ``InfeasibleError`` if none.

    Also ``SolverTimeoutError`` (time limit) and ``SolverMissingError`` (backend not installed).
    """
    if backend not in BACKENDS:
        raise ValueError(f"lp backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if deadline_slots < inst.compute:
        raise InfeasibleError(
            f"horizon {deadline_slots} slots is shorter than the computation ({inst.compute})"
        )
    built = _build(inst, deadline_slots)
    if built is None:
        raise InfeasibleError(f"horizon {deadline_slots} slots: some job cannot fit its window")
    if backend == "scipy":
        x = _solve_scipy(inst, built, time_limit_s)
    else:
        x = _solve_pulp(inst, built, backend, time_limit_s)
    if x is None:
        raise InfeasibleError(f"no schedule fits a horizon of {deadline_slots} slots")
    keep = x > _INTEGRALITY_TOL
    return tuple(
        zip(
            built.job[keep].tolist(),
            built.slot[keep].tolist(),
            x[keep].tolist(),
            strict=True,
        )
    )


def solve_lp(
    inst: SlotInstance,
    *,
    backend: str = "highs",
    time_limit_s: float = 60.0,
    hint_slots: int | None = None,
) -> LpSolution:
    """Smallest feasible horizon of the deadline LP, with its assignment.

    Without a hint: lower bound first, then bisection up to the trivial upper bound. With a hint
    (e.g. the exact solver's optimum in slots) two solves usually certify it. ``time_limit_s``
    bounds the whole search: ``SolverTimeoutError`` when exceeded.
    """
    t0 = time.perf_counter()
    history: list[tuple[int, bool]] = []
    found: dict[int, tuple[tuple[int, int, float], ...]] = {}
    variables = 0

    def feasible(d: int) -> bool:
        nonlocal variables
        left = time_limit_s - (time.perf_counter() - t0)
        if left <= 0:
            raise SolverTimeoutError(f"LP search exceeded its time limit ({time_limit_s:.3g} s)")
        window = np.maximum(d - inst.tail - inst.release, 0)
        variables = max(variables, int(window.sum()))
        try:
            found[d] = solve_deadline(inst, d, backend=backend, time_limit_s=left)
            ok = True
        except InfeasibleError:
            ok = False
        if time.perf_counter() - t0 > time_limit_s:
            raise SolverTimeoutError(f"LP search exceeded its time limit ({time_limit_s:.3g} s)")
        history.append((d, ok))
        return ok

    lb = inst.lower_bound
    infeasible_below = lb - 1  # largest horizon known infeasible (by the bound)
    hi: int | None = None
    if hint_slots is not None and hint_slots >= lb:
        if feasible(hint_slots):
            hi = hint_slots
            if hint_slots - 1 <= infeasible_below or not feasible(hint_slots - 1):
                infeasible_below = hint_slots - 1
            else:
                hi = hint_slots - 1
        else:
            infeasible_below = hint_slots
    if hi is None or hi - infeasible_below > 1:
        if hi is None:
            if infeasible_below < lb and feasible(lb):
                hi = lb
            else:
                infeasible_below = max(infeasible_below, lb)
                hi = max(inst.trivial_upper_bound, infeasible_below + 1)
                # Gallop from the lower end: optima are usually near the bound.
                step = 1
                while infeasible_below + step < hi:
                    d = infeasible_below + step
                    if feasible(d):
                        hi = d
                        break
                    infeasible_below = d
                    step *= 2
        while hi - infeasible_below > 1:
            mid = (hi + infeasible_below) // 2
            if feasible(mid):
                hi = mid
            else:
                infeasible_below = mid
        if hi not in found and not feasible(hi):
            raise InfeasibleError(f"the LP is infeasible at its upper bound ({hi} slots)")
    assignment = found[hi]
    frac = max((min(v, 1.0 - v) for _, _, v in assignment), default=0.0)
    frac = max(frac, 0.0)
    return LpSolution(
        makespan_slots=hi,
        slot_us=inst.slot_us,
        assignment=assignment,
        integral=frac <= _INTEGRALITY_TOL,
        max_fractionality=frac,
        backend=backend,
        solves=len(history),
        variables=variables,
        solve_seconds=time.perf_counter() - t0,
        history=tuple(history),
    )


def lp_pieces(
    inst: SlotInstance, sol: LpSolution, tail_us: Sequence[float]
) -> tuple[tuple[int, float, float], ...]:
    """Plan pieces ``(job, start_us, weight)`` from an LP assignment.

    Consecutive slots of one job merge into one piece. A fractional slot (only possible if the
    solver returned a non-vertex point) is shared in largest-tail-first order.
    """
    by_slot: dict[int, list[tuple[int, float]]] = {}
    for j, t, v in sol.assignment:
        by_slot.setdefault(t, []).append((j, v))
    pieces: list[list[Any]] = []
    for t in sorted(by_slot):
        acc = 0.0
        for j, v in sorted(by_slot[t], key=lambda jv: (-tail_us[jv[0]], jv[0])):
            start = (t + acc) * inst.slot_us
            acc += v
            if pieces and pieces[-1][0] == j:
                pieces[-1][2] += v
            else:
                pieces.append([j, start, v])
    return tuple((int(j), float(s), float(w)) for j, s, w in pieces)
