"""The overhead-aware choice among plans: candidate piece lists and their scores.

Every extra piece costs one more ``alpha`` in reality. Candidates: largest-tail-first planned
with the per-resume cost and a ladder of "do not preempt a job with less than theta left"
thresholds (theta = 0, alpha, 2 alpha, ... and infinity = the non-preemptive tail order), the
FIFO ready order, the order of need (earliest consumer start, TicTac's order), then greedy
merging of a job's pieces where that helps. Candidates are scored at job level with the one
replay kernel (``pace.replay``; exact for single-tensor jobs, an upper bound for fused groups),
and the finalists' units (``pace.lp.units``) with the contract's replay itself (``replay_us``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pace.ir import CommModel, Unit
from pace.lp.exact import solve_exact
from pace.lp.reduction import Reduction
from pace.lp.units import JobPiece, byte_bounds
from pace.replay import iteration_us, serial_replay, window_us


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class PieceCandidate:
    """One way to issue the jobs: its plan and its replayed time at job level.

    ``replay_us`` replays the plan's pieces (one call per piece, whole jobs): exact for
    single-tensor jobs, and an upper bound for fused groups, whose members may finish early.
    ``units_from_pieces(red, cand.pieces)`` gives the units (built only for the finalists).
    """

    name: str
    pieces: tuple[JobPiece, ...]
    replay_us: float


def replay_us(red: Reduction, units: Sequence[Unit]) -> float:
    """Iteration time of ``units`` under the replay semantics of docs/schedule-format.md: the
    one kernel, ``pace.replay.iteration_us`` (the update after each reduction included); with
    the trace's interference term, the simulator's event loop, where compute slows down
    beside communication."""
    analysis = red.tensors.analysis
    if interfering(red):
        from pace.sim import simulate, units_policy

        return simulate(analysis.trace, units_policy(units)).iteration_us
    return iteration_us(analysis, units)


def interfering(red: Reduction) -> bool:
    """Whether the trace charges communication to concurrent compute (``comm.interference``)."""
    term = red.tensors.analysis.trace.comm.interference
    return term is not None and term.active


def exact_pieces(
    red: Reduction,
    comm: CommModel,
    *,
    min_remaining_us: float = 0.0,
    grace_us: Sequence[float] | None = None,
) -> tuple[JobPiece, ...]:
    """Largest-tail-first plan where each resumed piece pays ``alpha`` again (``grace_us``: see
    :func:`~pace.lp.exact.solve_exact`)."""
    alpha = comm.alpha_us
    sol = solve_exact(
        red.release_us,
        red.duration_us,
        red.tail_us,
        compute_makespan_us=red.compute_makespan_us,
        preempt_cost_us=alpha,
        min_remaining_us=min_remaining_us,
        # With a latency, a piece must run alpha plus one byte to carry anything; without one,
        # keep Horn's rule exactly (it is optimal then).
        min_piece_us=alpha + comm.beta_us_per_byte if alpha > 0 else 0.0,
        grace_us=grace_us,
    )
    return tuple((j, s, max(e - s - alpha, 0.0)) for j, s, e in sol.pieces)


def slice_pieces(pieces: Sequence[JobPiece], max_piece_us: float) -> tuple[JobPiece, ...]:
    """Split every piece longer than ``max_piece_us`` (transmit time) into equal parts, in
    order: an urgent job that is ready late then waits behind one part, not a whole piece."""
    out: list[JobPiece] = []
    for j, start, w in pieces:
        k = max(1, math.ceil(w / max_piece_us)) if max_piece_us > 0 else 1
        out.extend((j, start + i * w / k, w / k) for i in range(k))
    return tuple(out)


def grace_candidates(
    red: Reduction,
    comm: CommModel,
    fractions: Sequence[float],
    slice_divisors: Sequence[int] = (),
) -> list[PieceCandidate]:
    """Largest tail first with slack at every preemption: job ``j`` preempts only
    ``f * release_j`` after its release, for each ``f`` in ``fractions``; and each such plan
    with its pieces sliced to at most ``longest job / d`` for each ``d`` in ``slice_divisors``.

    Jitter accumulates along the compute path, so a release's spread grows with its time; a
    grace proportional to it covers the same relative jitter everywhere. Slices bound how long
    a late urgent job waits when the grace is not enough (each slice pays ``alpha`` again).
    """
    out: list[PieceCandidate] = []
    seen: set[tuple[JobPiece, ...]] = set()
    longest = float(red.duration_us.max(initial=0.0))

    def add(name: str, pieces: tuple[JobPiece, ...]) -> None:
        if pieces not in seen:
            seen.add(pieces)
            out.append(_candidate(red, comm, name, pieces))

    for f in fractions:
        base = exact_pieces(red, comm, grace_us=(f * red.release_us).tolist())
        name = f"exact-grace{f * 100:g}%"
        add(name, base)
        for d in slice_divisors:
            add(f"{name}-slice{longest / d:.0f}us", slice_pieces(base, longest / d))
    return out


def _candidate(
    red: Reduction, comm: CommModel, name: str, pieces: Sequence[JobPiece]
) -> PieceCandidate:
    pieces = _sanitize(red, tuple(pieces))
    return PieceCandidate(name=name, pieces=pieces, replay_us=replay_pieces_us(red, comm, pieces))


def _sanitize(red: Reduction, pieces: tuple[JobPiece, ...]) -> tuple[JobPiece, ...]:
    """Merge the pieces of a fused group whose anchor has fewer bytes than the group has pieces.

    Such a piece would carry no byte of the anchor, become ready before the group's release,
    and a work-conserving replay could start it early, in front of jobs it was planned after.
    """
    counts: dict[int, int] = {}
    for j, _, _ in pieces:
        counts[j] = counts.get(j, 0) + 1
    timing = red.tensors
    for j, c in counts.items():
        if c > 1 and len(red.jobs[j]) > 1:
            members = [timing.index[name] for name in red.jobs[j]]
            anchor = max(members, key=lambda k: (timing.release_us[k], timing.size_bytes[k]))
            if int(timing.size_bytes[anchor]) < c:
                pieces = merge_pieces(pieces, j, at="first")
    return pieces


def replay_pieces_us(red: Reduction, comm: CommModel, pieces: Sequence[JobPiece]) -> float:
    """``replay_us`` at job level: each piece is one call of its rounded byte count, ready at
    its job's release; a job completes with its last piece (Theorem 1 with the job's tail).
    Pieces of zero bytes are dropped, as ``units_from_pieces`` drops them."""
    n_j = red.n_jobs
    weights: list[list[float]] = [[] for _ in range(n_j)]
    where: list[list[int]] = [[] for _ in range(n_j)]
    for i, (j, _, w) in enumerate(pieces):
        weights[j].append(w)
        where[j].append(i)
    nbytes = [0] * len(pieces)
    size = red.size_bytes.tolist()
    for j in range(n_j):
        if not where[j]:
            return math.inf  # an incomplete plan; units_from_pieces would patch it
        prev = 0
        for i, b in zip(where[j], byte_bounds(size[j], weights[j]), strict=True):
            nbytes[i] = b - prev
            prev = b
    kept = [i for i in range(len(pieces)) if nbytes[i] > 0]
    release = red.release_us.tolist()
    alpha, beta = comm.alpha_us, comm.beta_us_per_byte
    _, finish = serial_replay(
        [release[pieces[i][0]] for i in kept],
        [alpha + beta * nbytes[i] for i in kept],
        [pieces[i][1] for i in kept],
    )
    done = [0.0] * n_j
    for f, i in zip(finish, kept, strict=True):
        j = pieces[i][0]
        done[j] = max(done[j], f)
    return window_us(red.compute_makespan_us, done, red.tail_us.tolist())


def retime_pieces(
    red: Reduction, comm: CommModel, pieces: Sequence[JobPiece]
) -> tuple[JobPiece, ...]:
    """Execute a slotted plan (the LP's) in continuous time: its completion order as priorities.

    Slot rounding moves releases and durations by up to a slot, so the LP's own piece times are
    not work-conserving in real time, and the contract's work-conserving replay would run later
    pieces early and cascade (measured: +12% on a random trace). Instead each job gets the
    priority of its completion in the LP plan (earlier = more urgent, the LP's deadline order)
    and the channel runs preemptive highest-priority-first in continuous time — with the same
    per-resume ``alpha`` and minimum-piece rules as the exact planner — so planned and replayed
    times agree.
    """
    finish: dict[int, float] = {}
    for j, start, _ in pieces:
        finish[j] = max(finish.get(j, -math.inf), start)
    key = [-finish.get(j, float(red.release_us[j])) for j in range(red.n_jobs)]
    alpha = comm.alpha_us
    sol = solve_exact(
        red.release_us,
        red.duration_us,
        key,
        preempt_cost_us=alpha,
        min_piece_us=alpha + comm.beta_us_per_byte if alpha > 0 else 0.0,
    )
    return tuple((j, s, max(e - s - alpha, 0.0)) for j, s, e in sol.pieces)


def static_order_pieces(red: Reduction, key: Sequence[float]) -> tuple[JobPiece, ...]:
    """One whole piece per job with priority ``key[j]`` (a non-preemptive static order)."""
    return tuple((j, float(key[j]), 1.0) for j in range(red.n_jobs))


def need_us(red: Reduction) -> list[float]:
    """When each job is first needed if nothing waited on communication (TicTac's order):
    the compute-only start of its earliest consumer (no consumer: never, last)."""
    timing = red.tensors
    return [float(min(timing.need_us[timing.index[name]] for name in job)) for job in red.jobs]


def merge_pieces(pieces: Sequence[JobPiece], job: int, *, at: str) -> tuple[JobPiece, ...]:
    """``pieces`` with all of ``job``'s pieces fused into one at its first or last start."""
    mine = [p for p in pieces if p[0] == job]
    start = mine[0][1] if at == "first" else mine[-1][1]
    weight = sum(p[2] for p in mine) or 1.0
    out = [p for p in pieces if p[0] != job]
    out.append((job, start, weight))
    out.sort(key=lambda p: p[1])
    return tuple(out)


def overhead_aware_candidates(
    red: Reduction,
    comm: CommModel,
    *,
    base: Sequence[tuple[str, Sequence[JobPiece]]] = (),
    include_exact: bool = True,
    merge_budget: int = 16,
) -> list[PieceCandidate]:
    """Every candidate plan, scored by ``replay_us``; the last element is the greedy-merged best.

    ``base`` adds plans from elsewhere (the LP). With ``alpha = 0`` the plain largest-tail-first
    plan is optimal and is always among the candidates.
    """
    cands: list[PieceCandidate] = [_candidate(red, comm, name, p) for name, p in base]
    alpha = comm.alpha_us
    seen: set[tuple[JobPiece, ...]] = set()
    if include_exact:
        longest = float(red.duration_us.max(initial=0.0))
        thetas = [0.0]
        if alpha > 0:
            # Geometric ladder (x4): each rung is one O(N log N) solve and one replay.
            theta = alpha
            while theta < longest:
                thetas.append(theta)
                theta *= 4
        for theta in thetas:
            pieces = exact_pieces(red, comm, min_remaining_us=theta)
            if pieces not in seen:
                seen.add(pieces)
                name = "exact" if theta == 0 else f"exact-theta{theta:g}us"
                cands.append(_candidate(red, comm, name, pieces))
    cands.append(
        _candidate(red, comm, "tail-order", exact_pieces(red, comm, min_remaining_us=math.inf))
    )
    cands.append(
        _candidate(red, comm, "fifo-order", static_order_pieces(red, red.release_us.tolist()))
    )
    cands.append(_candidate(red, comm, "need-order", static_order_pieces(red, need_us(red))))
    best = min(cands, key=lambda c: c.replay_us)
    improved = _greedy_merge(red, comm, best, merge_budget)
    if improved is not best:
        cands.append(improved)
    return cands


def _greedy_merge(
    red: Reduction, comm: CommModel, cand: PieceCandidate, budget: int
) -> PieceCandidate:
    """Drop preemptions that do not pay: merge a split job's pieces while the replay improves."""
    counts: dict[int, int] = {}
    for j, _, _ in cand.pieces:
        counts[j] = counts.get(j, 0) + 1
    split = sorted((j for j, c in counts.items() if c > 1), key=lambda j: -counts[j])
    best = cand
    for j in split:
        for at in ("first", "last"):
            if budget <= 0:
                return best
            budget -= 1
            trial = _candidate(red, comm, f"{cand.name}+merge", merge_pieces(best.pieces, j, at=at))
            if trial.replay_us < best.replay_us:
                best = trial
                break
    return best


def units_bound_us(red: Reduction, comm: CommModel, units: Sequence[Unit]) -> float:
    """Free-preemption bound on the replay of ``units`` (jobs are single tensors): each job
    holds the channel ``alpha`` per unit carrying it plus ``beta`` per byte."""
    calls = np.zeros(red.n_jobs)
    job = {names[0]: j for j, names in enumerate(red.jobs)}
    for unit in units:
        for name in {s.tensor for s in unit.slices}:
            calls[job[name]] += 1
    return solve_exact(
        red.release_us,
        comm.alpha_us * calls + comm.beta_us_per_byte * red.size_bytes,
        red.tail_us,
        compute_makespan_us=red.compute_makespan_us,
    ).makespan_us
