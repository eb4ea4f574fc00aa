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
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pace.errors import InfeasibleError, InputError, SolverMissingError, SolverTimeoutError
from pace.lp.exact import solve_exact
from pace.lp.reduction import Reduction
from pace.options import LP_BACKENDS, LpBackend

IntArray = npt.NDArray[np.int64]
# The option set is pace.options.LpBackend; these names are kept for pace.lp's callers.
Backend = LpBackend
BACKENDS: tuple[LpBackend, ...] = LP_BACKENDS

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
        raise InputError(f"must be a positive number, got {slot_us!r}", field="slot_us")
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
    """The LP's optimum ``makespan_slots`` and a slot assignment achieving it.

    ``assignment`` lists ``(job, first_slot, n_slots)``: ``x_job(t) = 1`` for
    ``first_slot <= t < first_slot + n_slots`` (floats only if the solver returned a non-vertex
    point). The optimum is always proved: ``history`` holds the horizons tried and whether each
    was feasible; ``makespan_slots - 1`` is infeasible there or below the lower bound.
    ``max_fractionality`` is the largest distance of an LP variable from an integer (0 for a
    vertex solution, as total unimodularity promises). ``variables`` counts the aggregated LP's
    columns, ``slot_variables`` the paper's ``x_i(t)`` they stand for.
    """

    makespan_slots: int
    slot_us: float
    assignment: tuple[tuple[int, float, float], ...]
    integral: bool
    max_fractionality: float
    backend: str
    solves: int
    variables: int
    slot_variables: int
    solve_seconds: float
    history: tuple[tuple[int, bool], ...] = field(default=())

    @property
    def makespan_us(self) -> float:
        return self.makespan_slots * self.slot_us


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class _Built:
    """The aggregated deadline LP: columns (window class g, interval k)."""

    col_group: IntArray
    col_interval: IntArray
    cost: npt.NDArray[np.float64]
    demand: npt.NDArray[np.float64]  # per window class: sum of its jobs' p_i
    capacity: npt.NDArray[np.float64]  # per interval: its length in slots
    bounds: IntArray  # interval k is [bounds[k], bounds[k+1])
    members: tuple[tuple[int, ...], ...]  # jobs of each window class, by (release, index)
    group_rank: IntArray  # 0 = most urgent window class
    slot_variables: int


def _build(inst: SlotInstance, deadline: int) -> _Built | None:
    """The deadline-``deadline`` LP, or ``None`` if a job cannot fit its own window.

    Two exact aggregations keep the paper's slotted LP small: jobs with the same window
    ``[r_i, D - q_i)`` form one *window class* (any split of the class's slots among its jobs
    is feasible), and runs of slots between consecutive window ends form one *interval* with
    capacity = its length (all slots of an interval are interchangeable for every class). The
    result is still a bipartite transportation matrix (totally unimodular); an integral solution
    expands to integral ``x_i(t)`` by laying each interval's amounts out slot by slot, and every
    integral ``x_i(t)`` aggregates to a feasible solution, so the optimum horizon is the same.
    """
    n = inst.n_jobs
    lo = inst.release
    hi = deadline - inst.tail
    if n and ((hi - lo) < inst.duration).any():
        return None
    keys, inverse = np.unique(np.stack([hi, lo], axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    n_g = keys.shape[0]
    g_hi = keys[:, 0]
    g_lo = keys[:, 1]
    dur = inst.duration.astype(np.float64)
    demand = np.bincount(inverse, weights=dur, minlength=n_g).astype(np.float64)
    members_l: list[list[int]] = [[] for _ in range(n_g)]
    for j in np.lexsort((np.arange(n), lo)).tolist():
        members_l[int(inverse[j])].append(j)
    bounds = np.unique(np.concatenate([g_lo, g_hi]))
    first = np.searchsorted(bounds, g_lo)
    last = np.searchsorted(bounds, g_hi)  # intervals first..last-1
    counts = last - first
    col_group = np.repeat(np.arange(n_g, dtype=np.int64), counts)
    offsets = np.concatenate(([0], np.cumsum(counts)[:-1]))
    col_interval = np.arange(col_group.size, dtype=np.int64) - np.repeat(offsets - first, counts)
    # Window classes by deadline (earliest first), then release: rank 0 is the most urgent.
    order = np.lexsort((g_lo, g_hi))
    rank = np.empty(n_g, dtype=np.int64)
    rank[order] = np.arange(n_g)
    weight = 2.0 - rank.astype(np.float64) / max(n_g, 1)
    # Cost of a unit of work in interval k: its start slot + 1 (moving work earlier pays), with
    # weights strictly decreasing in urgency (urgent work goes first: an exchange argument makes
    # the optimum the slotted largest-tail-first schedule).
    cost = (bounds[col_interval].astype(np.float64) + 1.0) * weight[col_group]
    return _Built(
        col_group=col_group,
        col_interval=col_interval,
        cost=cost,
        demand=demand,
        capacity=np.diff(bounds).astype(np.float64),
        bounds=bounds.astype(np.int64),
        members=tuple(tuple(m) for m in members_l),
        group_rank=rank,
        slot_variables=int(np.maximum(hi - lo, 0).sum()),
    )


def _solve_scipy(b: _Built, time_limit_s: float) -> npt.NDArray[np.float64] | None:
    try:
        from scipy.optimize import linprog
        from scipy.sparse import csr_array
    except ImportError as exc:
        raise SolverMissingError("scipy is not installed") from exc
    nv = b.col_group.size
    cols = np.arange(nv)
    ones = np.ones(nv)
    a_eq = csr_array((ones, (b.col_group, cols)), shape=(b.demand.size, nv))
    a_ub = csr_array((ones, (b.col_interval, cols)), shape=(b.capacity.size, nv))
    res = linprog(
        b.cost,
        A_ub=a_ub,
        b_ub=b.capacity,
        A_eq=a_eq,
        b_eq=b.demand,
        bounds=(0.0, None),
        method="highs",
        options={"time_limit": max(time_limit_s, 1e-3)},
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
    with warnings.catch_warnings():
        # pulp 3.3 deprecates its bundled CBC for 4.0; it is still the one that ships.
        warnings.simplefilter("ignore", DeprecationWarning)
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(1, math.ceil(tl)))
    if not solver.available():
        raise SolverMissingError("pulp's CBC binary is not available")
    return solver


def _solve_pulp(b: _Built, backend: str, time_limit_s: float) -> npt.NDArray[np.float64] | None:
    solver = _pulp_solver(backend, time_limit_s)
    import pulp

    prob = pulp.LpProblem("pace_deadline_lp", pulp.LpMinimize)
    # pulp >= 3.3 attaches variables to the model (LpVariable(...) alone is deprecated there).
    new_var = getattr(prob, "add_variable", None) or pulp.LpVariable
    xs = [
        new_var(f"x_{g}_{k}", 0)
        for g, k in zip(b.col_group.tolist(), b.col_interval.tolist(), strict=True)
    ]
    prob += pulp.LpAffineExpression(zip(xs, b.cost.tolist(), strict=True))
    by_group: list[list[Any]] = [[] for _ in range(b.demand.size)]
    by_interval: list[list[Any]] = [[] for _ in range(b.capacity.size)]
    for v, (g, k) in enumerate(zip(b.col_group.tolist(), b.col_interval.tolist(), strict=True)):
        by_group[g].append(xs[v])
        by_interval[k].append(xs[v])
    for g, vs in enumerate(by_group):  # (3), per window class
        prob += pulp.LpAffineExpression([(x, 1.0) for x in vs]) == float(b.demand[g])
    for k, vs in enumerate(by_interval):  # (6), per interval of identical slots
        if vs:
            prob += pulp.LpAffineExpression([(x, 1.0) for x in vs]) <= float(b.capacity[k])
    prob.solve(solver)
    if backend == "highs":
        import highspy

        status = prob.solverModel.getModelStatus()
        hs = highspy.HighsModelStatus
        if status in (hs.kInfeasible, hs.kUnboundedOrInfeasible):
            return None
        if status in (hs.kTimeLimit, hs.kIterationLimit, hs.kInterrupt):
            raise SolverTimeoutError(f"HiGHS hit its time limit ({time_limit_s:.3g} s)")
        if status != hs.kOptimal:
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


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class _Solved:
    assignment: tuple[tuple[int, float, float], ...]
    max_fractionality: float
    variables: int
    slot_variables: int


def _expand(inst: SlotInstance, b: _Built, x: npt.NDArray[np.float64]) -> _Solved:
    """Lay the aggregated amounts out slot by slot: urgent classes first inside an interval,
    a class's slots to its jobs in release order (each job's run stays contiguous)."""
    frac = float(np.abs(x - np.round(x)).max(initial=0.0))
    need = inst.duration.astype(np.float64)
    cursor = [0] * len(b.members)  # next member of each class still needing slots
    by_interval: dict[int, list[tuple[int, float]]] = {}
    for g, k, v in zip(b.col_group.tolist(), b.col_interval.tolist(), x.tolist(), strict=True):
        if v > _INTEGRALITY_TOL:
            by_interval.setdefault(k, []).append((g, v))
    out: list[tuple[int, float, float]] = []
    for k in sorted(by_interval):
        t = float(b.bounds[k])
        for g, v in sorted(by_interval[k], key=lambda gv: int(b.group_rank[gv[0]])):
            left = v
            mem = b.members[g]
            while left > _INTEGRALITY_TOL and cursor[g] < len(mem):
                j = mem[cursor[g]]
                take = min(left, float(need[j]))
                if take > _INTEGRALITY_TOL:
                    if out and out[-1][0] == j and abs(out[-1][1] + out[-1][2] - t) < 1e-9:
                        out[-1] = (j, out[-1][1], out[-1][2] + take)  # one run across intervals
                    else:
                        out.append((j, t, take))
                t += take
                left -= take
                need[j] -= take
                if need[j] <= _INTEGRALITY_TOL:
                    cursor[g] += 1
    return _Solved(
        assignment=tuple(out),
        max_fractionality=frac,
        variables=int(b.col_group.size),
        slot_variables=b.slot_variables,
    )


def _solve_at(
    inst: SlotInstance, deadline_slots: int, backend: str, time_limit_s: float
) -> _Solved:
    _check_backend(backend)
    if deadline_slots < inst.compute:
        raise InfeasibleError(
            f"horizon {deadline_slots} slots is shorter than the computation ({inst.compute})"
        )
    built = _build(inst, deadline_slots)
    if built is None:
        raise InfeasibleError(f"horizon {deadline_slots} slots: some job cannot fit its window")
    if backend == "scipy":
        x = _solve_scipy(built, time_limit_s)
    else:
        x = _solve_pulp(built, backend, time_limit_s)
    if x is None:
        raise InfeasibleError(f"no schedule fits a horizon of {deadline_slots} slots")
    return _expand(inst, built, x)


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise InputError(
            f"lp backend must be one of {', '.join(BACKENDS)}, got {backend!r}", field="backend"
        )


def solve_deadline(
    inst: SlotInstance,
    deadline_slots: int,
    *,
    backend: str = "highs",
    time_limit_s: float = 60.0,
) -> tuple[tuple[int, float, float], ...]:
    """An assignment ``(job, first_slot, n_slots)`` meeting horizon ``deadline_slots``.

    Raises ``InfeasibleError`` if there is none, ``SolverTimeoutError`` on the time limit and
    ``SolverMissingError`` if the backend is not installed.
    """
    return _solve_at(inst, deadline_slots, backend, time_limit_s).assignment


def solve_lp(
    inst: SlotInstance,
    *,
    backend: str = "highs",
    time_limit_s: float = 60.0,
    hint_slots: int | None = None,
) -> LpSolution:
    """Smallest feasible horizon of the deadline LP, with its assignment.

    Without a hint: the lower bound first, then galloping and bisection up to the trivial upper
    bound. With a hint (e.g. the exact solver's optimum in slots) two solves usually certify it.
    ``time_limit_s`` bounds the whole search: ``SolverTimeoutError`` when exceeded.
    """
    _check_backend(backend)
    t0 = time.perf_counter()
    history: list[tuple[int, bool]] = []
    found: dict[int, _Solved] = {}

    def feasible(d: int) -> bool:
        left = time_limit_s - (time.perf_counter() - t0)
        if left <= 0:
            raise SolverTimeoutError(f"LP search exceeded its time limit ({time_limit_s:.3g} s)")
        try:
            found[d] = _solve_at(inst, d, backend, left)
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
    if hi is None:
        if infeasible_below < lb and feasible(lb):
            hi = lb
        else:
            infeasible_below = max(infeasible_below, lb)
            hi = max(inst.trivial_upper_bound, infeasible_below + 1)
            # Gallop up from the lower end: optima are usually near the bound.
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
    best = found[hi]
    return LpSolution(
        makespan_slots=hi,
        slot_us=inst.slot_us,
        assignment=best.assignment,
        integral=best.max_fractionality <= _INTEGRALITY_TOL,
        max_fractionality=best.max_fractionality,
        backend=backend,
        solves=len(history),
        variables=max(s.variables for s in found.values()),
        slot_variables=max(s.slot_variables for s in found.values()),
        solve_seconds=time.perf_counter() - t0,
        history=tuple(history),
    )


def lp_pieces(inst: SlotInstance, sol: LpSolution) -> tuple[tuple[int, float, float], ...]:
    """Plan pieces ``(job, start_us, weight)``; consecutive runs of one job merge into one."""
    pieces: list[list[Any]] = []
    for j, start, length in sorted(sol.assignment, key=lambda a: a[1]):
        if pieces and pieces[-1][0] == j:
            pieces[-1][2] += length
        else:
            pieces.append([j, start * inst.slot_us, length])
    return tuple((int(j), float(s), float(w)) for j, s, w in pieces)
