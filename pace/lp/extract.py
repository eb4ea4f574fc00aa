"""From a planned channel schedule to schedule units, and the overhead-aware choice among plans.

**Pieces to units.** A plan is a list of pieces ``(job, start_us, weight)`` in time order; each
piece becomes one all-reduce call (a unit) with ``priority = start_us``. A job's bytes are split
over its pieces in proportion to ``weight`` (its transmit time, ``duration - alpha``: under the
cost model a piece of transmit time ``d`` carries ``d / beta`` bytes). Boundaries are rounded
*up* to whole bytes, the last piece takes the remainder: the replay is work-conserving, so a
piece that ended a hair before the release it was planned to end at would let the job's next
piece jump in ahead of the more urgent job; ending a hair late only shifts it by < beta.

For a fused group the pieces span the group's concatenated bytes, so a unit carries slices of
several tensors. The member released last (the *anchor*, which sets the group's release) is cut
in proportion across all pieces, so every piece of the group carries a slice of it and becomes
ready exactly at the group's release, as planned; the other members fill the rest contiguously.
(A member may then finish before the whole group does, which only lets its consumers start
earlier: never later than planned.)

**Overhead-aware choice.** Every extra piece costs one more ``alpha`` in reality. Candidates:
largest-tail-first planned with the per-resume cost and a ladder of "do not preempt a job with
less than theta left" thresholds (theta = 0, alpha, 2 alpha, ... and infinity = the non-preemptive
tail order), the FIFO ready order, the order of need (earliest consumer start, TicTac's order),
then greedy merging of a job's pieces where that helps. Candidates are scored at job level with
the one replay kernel (``pace.replay``; exact for single-tensor jobs, an upper bound for fused
groups), and the finalists' units with the contract's replay itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pace.ir import CommModel, Slice, Unit
from pace.lp.exact import solve_exact
from pace.lp.reduction import Reduction, TensorTiming
from pace.replay import iteration_us, serial_replay, window_us

JobPiece = tuple[int, float, float]
"""``(job, start_us, weight)``: a planned piece; bytes of the job are split by ``weight``."""


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


def _byte_bounds(size: int, weights: Sequence[float]) -> list[int]:
    """Cumulative byte boundaries (rounded up; last = ``size``) for a job split by ``weights``."""
    m = len(weights)
    total = float(sum(weights))
    if m == 1 or total <= 0.0:
        return [size] if m == 1 else [size] * m
    bounds: list[int] = []
    acc = 0.0
    prev = 0
    for w in weights[:-1]:
        acc += w
        exact = size * acc / total
        # Round up. The tolerance is absolute and tiny on purpose: a relative one would round
        # 1836787.0009 down and end the piece a hair before the release it must end at.
        b = math.ceil(exact - 1e-9)
        b = min(max(b, prev), size)
        bounds.append(b)
        prev = b
    bounds.append(size)
    return bounds


def _anchor_bounds(size: int, a_size: int, bounds: Sequence[int]) -> list[int]:
    """Cumulative anchor bytes per piece: about proportional, but at least one per piece when
    the anchor has enough bytes, so that every piece waits for the group's release."""
    m = len(bounds)
    rest_total = size - a_size
    out: list[int] = []
    prev_a = 0
    prev_b = 0
    for k, b in enumerate(bounds, start=1):
        if k == m:
            out.append(a_size)
            break
        target = (a_size * b) // size
        # Hard: the piece's anchor share fits the piece, and the rest fits the other members.
        hard_lo = max(prev_a, b - rest_total)
        hard_hi = min(prev_a + (b - prev_b), a_size)
        # Soft: one anchor byte here, and one left for each later piece.
        soft_lo = max(hard_lo, prev_a + 1)
        soft_hi = min(hard_hi, a_size - (m - k))
        lo, hi = (soft_lo, soft_hi) if soft_lo <= soft_hi else (hard_lo, hard_hi)
        a = min(max(target, lo), hi)
        out.append(a)
        prev_a, prev_b = a, b
    return out


def units_from_pieces(red: Reduction, pieces: Sequence[JobPiece]) -> tuple[Unit, ...]:
    """Schedule units for ``pieces``; every tensor's bytes are covered exactly once.

    Pieces that would carry zero bytes are dropped; a job with no piece gets one unit at its
    release (so a partial plan still compiles to a complete schedule).
    """
    timing = red.tensors
    by_job: list[list[tuple[float, float]]] = [[] for _ in range(red.n_jobs)]
    for job, start, weight in pieces:
        by_job[job].append((start, weight))
    units: list[tuple[float, int, tuple[Slice, ...]]] = []
    seq = 0
    for j, members in enumerate(red.jobs):
        plan = by_job[j] or [(float(red.release_us[j]), 1.0)]
        plan.sort(key=lambda sw: sw[0])
        size = int(red.size_bytes[j])
        bounds = _byte_bounds(size, [w for _, w in plan])
        midx = [timing.index[name] for name in members]
        msize = [int(timing.size_bytes[k]) for k in midx]
        # Anchor: latest release, then largest (ties by plan order).
        anchor = max(range(len(members)), key=lambda i: (timing.release_us[midx[i]], msize[i]))
        a_size = msize[anchor]
        rest = [i for i in range(len(members)) if i != anchor]
        # Byte offset of each non-anchor member inside the "rest" concatenation.
        rest_off: list[int] = []
        acc = 0
        for i in rest:
            rest_off.append(acc)
            acc += msize[i]
        prev_b = 0
        prev_a = 0
        kept: list[tuple[float, int]] = []
        last_b = 0
        for (start, _), b in zip(plan, bounds, strict=True):
            if b > last_b:
                kept.append((start, b))
                last_b = b
        for (start, b), a in zip(
            kept, _anchor_bounds(size, a_size, [b for _, b in kept]), strict=True
        ):
            slices: list[tuple[int, Slice]] = []
            if a > prev_a:
                slices.append(
                    (
                        anchor,
                        Slice(tensor=members[anchor], offset_bytes=prev_a, size_bytes=a - prev_a),
                    )
                )
            lo, hi = prev_b - prev_a, b - a
            if hi > lo:
                for pos, i in enumerate(rest):
                    m_lo = rest_off[pos]
                    m_hi = m_lo + msize[i]
                    s_lo, s_hi = max(lo, m_lo), min(hi, m_hi)
                    if s_hi > s_lo:
                        slices.append(
                            (
                                i,
                                Slice(
                                    tensor=members[i],
                                    offset_bytes=s_lo - m_lo,
                                    size_bytes=s_hi - s_lo,
                                ),
                            )
                        )
            slices.sort(key=lambda x: x[0])
            units.append((start, seq, tuple(s for _, s in slices)))
            seq += 1
            prev_b, prev_a = b, a
    units.sort(key=lambda u: (u[0], u[1]))
    out = tuple(Unit(priority=float(p), slices=s) for p, _, s in units)
    if int(timing.element_bytes.max(initial=1)) > 1:
        out = align_to_elements(out, timing)
    return out


def align_to_elements(units: Sequence[Unit], timing: TensorTiming) -> tuple[Unit, ...]:
    """``units`` with every slice boundary moved up to a multiple of its tensor's element size.

    The runtime all-reduces whole elements, so a partition must not split one. Within each
    tensor, the boundaries between consecutive slices are rounded up (the same direction as
    ``_byte_bounds``: a piece never ends before its planned end); rounding is monotone, so the
    slices still cover every byte exactly once. A slice left empty is dropped, and so is a unit
    left without slices. The shift is under one element per boundary.
    """
    by_tensor: dict[str, list[tuple[int, int, int]]] = {}
    for u, unit in enumerate(units):
        for s_i, s in enumerate(unit.slices):
            by_tensor.setdefault(s.tensor, []).append((s.offset_bytes, u, s_i))
    new_bounds: dict[tuple[int, int], tuple[int, int]] = {}
    for name, parts in by_tensor.items():
        k = timing.index[name]
        elem = int(timing.element_bytes[k])
        size = int(timing.size_bytes[k])
        parts.sort()
        starts = [off for off, _, _ in parts] + [size]
        aligned = [min(size, -(-b // elem) * elem) for b in starts]
        for j, (_, u, s_i) in enumerate(parts):
            new_bounds[(u, s_i)] = (aligned[j], aligned[j + 1])
    out: list[Unit] = []
    for u, unit in enumerate(units):
        slices = []
        for s_i, s in enumerate(unit.slices):
            lo, hi = new_bounds[(u, s_i)]
            if hi > lo:
                slices.append(Slice(tensor=s.tensor, offset_bytes=lo, size_bytes=hi - lo))
        if slices:
            out.append(Unit(priority=unit.priority, slices=tuple(slices)))
    return tuple(out)


def replay_us(red: Reduction, units: Sequence[Unit]) -> float:
    """Iteration time of ``units`` under the replay semantics of docs/schedule-format.md: the
    one kernel, ``pace.replay.iteration_us``; with the trace's interference term, the
    simulator's event loop, where compute slows down beside communication."""
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
        for i, b in zip(where[j], _byte_bounds(size[j], weights[j]), strict=True):
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
