"""From a planned channel schedule to schedule units.

A plan is a list of pieces ``(job, start_us, weight)`` in time order; each piece becomes one
all-reduce call (a unit) with ``priority = start_us``. A job's bytes are split over its pieces
in proportion to ``weight`` (its transmit time, ``duration - alpha``: under the cost model a
piece of transmit time ``d`` carries ``d / beta`` bytes). Boundaries are rounded *up* to whole
bytes, the last piece takes the remainder: the replay is work-conserving, so a piece that ended
a hair before the release it was planned to end at would let the job's next piece jump in ahead
of the more urgent job; ending a hair late only shifts it by < beta.

For a fused group the pieces span the group's concatenated bytes, so a unit carries slices of
several tensors. The member released last (the *anchor*, which sets the group's release) is cut
in proportion across all pieces, so every piece of the group carries a slice of it and becomes
ready exactly at the group's release, as planned; the other members fill the rest contiguously.
(A member may then finish before the whole group does, which only lets its consumers start
earlier: never later than planned.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pace.ir import Slice, Unit
from pace.lp.reduction import Reduction, TensorTiming

JobPiece = tuple[int, float, float]
"""``(job, start_us, weight)``: a planned piece; bytes of the job are split by ``weight``."""


def byte_bounds(size: int, weights: Sequence[float]) -> list[int]:
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
        bounds = byte_bounds(size, [w for _, w in plan])
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
    ``byte_bounds``: a piece never ends before its planned end); rounding is monotone, so the
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
