"""Jittered replay: how a compiled schedule behaves when op durations wobble.

An optimal preemptive schedule is timed to the microsecond: a partition ends exactly where a
later, more urgent gradient is released. If that gradient is ready a hair late, the
work-conserving replay starts the next (large) piece of the preempted job, and the urgent one
waits behind it — head-of-line blocking. The robust selection in :func:`pace.lp.schedule` scores
candidates by their mean replay over a few jittered copies of the trace (every op duration times
an independent lognormal factor, fixed seed: ``pace.jitter.JitterModel(op_sd=...)``, the model
drift re-planning also judges switches with) and keeps the nominal guarantees by only choosing
among candidates whose nominal replay is within a small tolerance of the best.

By Lemma 1 the channel's behaviour depends only on when tensors are produced, so a jittered world
is just new tensor releases, tails and compute makespan: one forward and one backward sweep over
the op DAG, vectorised across all worlds at once (numpy arrays of one value per world per op).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pace.ir import CommModel, Trace, Unit
from pace.jitter import JitterModel

__all__ = [
    "ROBUST_SAMPLES",
    "ROBUST_SD",
    "ROBUST_SEED",
    "ROBUST_TOLERANCE",
    "JitterWorlds",
    "jitter_worlds",
    "jittered_replays_us",
]

ROBUST_SAMPLES = 8
"""Jittered worlds each candidate is replayed on."""
ROBUST_SD = 0.02
"""Standard deviation of the log of each op's duration factor (about 2% jitter)."""
ROBUST_SEED = 0
ROBUST_TOLERANCE = 0.005
"""A robust choice may be at most this much (relative) slower nominally than the best."""

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, kw_only=True, slots=True)
class JitterWorlds:
    """Per-world tensor timing: ``release_us[w, k]``, ``tail_us[w, k]`` (tensor ``k`` in trace
    order, ``index`` maps names), ``compute_makespan_us[w]``."""

    release_us: FloatArray
    tail_us: FloatArray
    compute_makespan_us: FloatArray
    index: dict[str, int]

    @property
    def samples(self) -> int:
        return int(self.compute_makespan_us.shape[0])


_CACHE: OrderedDict[tuple[int, int, float, int], tuple[Trace, JitterWorlds]] = OrderedDict()
_CACHE_SIZE = 8


def jitter_worlds(
    trace: Trace,
    *,
    samples: int = ROBUST_SAMPLES,
    sd: float = ROBUST_SD,
    seed: int = ROBUST_SEED,
) -> JitterWorlds:
    """Tensor releases and tails of ``samples`` jittered copies of ``trace`` (cached).

    Deterministic: the factors come from ``numpy.random.default_rng(seed)``. The trace must
    already be valid (``pace.lp.reduction`` checks it first in every caller).

    >>> from pace.synth import random_trace
    >>> w = jitter_worlds(random_trace(seed=1, n_layers=3), samples=4)
    >>> w.release_us.shape[0], w.samples
    (4, 4)
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if not (sd >= 0 and math.isfinite(sd)):
        raise ValueError(f"sd must be a finite number >= 0, got {sd!r}")
    key = (id(trace), samples, sd, seed)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is trace:
        _CACHE.move_to_end(key)
        return hit[1]
    worlds = _compute(trace, samples=samples, sd=sd, seed=seed)
    _CACHE[key] = (trace, worlds)
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return worlds


def _compute(trace: Trace, *, samples: int, sd: float, seed: int) -> JitterWorlds:
    idx = {op.name: i for i, op in enumerate(trace.ops)}
    n_ops = len(trace.ops)
    preds = [[idx[d] for d in op.deps] for op in trace.ops]
    succs: list[list[int]] = [[] for _ in range(n_ops)]
    indeg = [len(p) for p in preds]
    for v, pv in enumerate(preds):
        for u in pv:
            succs[u].append(v)
    # Kahn's algorithm (the reduction already rejected cycles).
    order = [v for v in range(n_ops) if indeg[v] == 0]
    for v in order:
        for s in succs[v]:
            indeg[s] -= 1
            if indeg[s] == 0:
                order.append(s)
    base = np.fromiter((op.duration_us for op in trace.ops), dtype=np.float64, count=n_ops)
    # The project's one jitter model (pace.jitter), per-op factors only.
    dur = base[:, None] * JitterModel(op_sd=sd, samples=samples, seed=seed).op_factors(trace)
    finish = np.zeros((n_ops, samples))
    zero = np.zeros(samples)
    for v in order:
        acc = zero
        for u in preds[v]:
            acc = np.maximum(acc, finish[u])
        finish[v] = acc + dur[v]
    from_start = np.zeros((n_ops, samples))
    for v in reversed(order):
        acc = zero
        for s in succs[v]:
            acc = np.maximum(acc, from_start[s])
        from_start[v] = acc + dur[v]
    n_t = len(trace.tensors)
    release = np.empty((samples, n_t))
    tail = np.zeros((samples, n_t))
    for k, t in enumerate(trace.tensors):
        release[:, k] = finish[idx[t.producer]]
        for c in t.consumers:
            tail[:, k] = np.maximum(tail[:, k], from_start[idx[c]])
    makespan = finish.max(axis=0) if n_ops else np.zeros(samples)
    return JitterWorlds(
        release_us=release,
        tail_us=tail,
        compute_makespan_us=makespan,
        index={t.name: k for k, t in enumerate(trace.tensors)},
    )


def jittered_replays_us(
    worlds: JitterWorlds, comm: CommModel, units: Sequence[Unit]
) -> list[float]:
    """The replay (docs/schedule-format.md semantics) of ``units`` in every world, as
    ``replay_us`` computes it: a priority list schedule of the units (Lemma 1), then Theorem 1
    with each tensor's tail."""
    n = len(units)
    members = [[worlds.index[s.tensor] for s in unit.slices] for unit in units]
    cost = [comm.alpha_us + comm.beta_us_per_byte * unit.size_bytes for unit in units]
    order = sorted(range(n), key=lambda u: (units[u].priority, u))
    rank = [0] * n
    for pos, u in enumerate(order):
        rank[u] = pos
    out: list[float] = []
    for w in range(worlds.samples):
        rel = worlds.release_us[w]
        ready = [max(float(rel[k]) for k in m) for m in members]
        by_ready = sorted(range(n), key=ready.__getitem__)
        heap: list[tuple[int, int]] = []
        t = 0.0
        k = 0
        finish = [0.0] * n
        for _ in range(n):
            if not heap:
                t = max(t, ready[by_ready[k]])
            while k < n and ready[by_ready[k]] <= t:
                u = by_ready[k]
                heapq.heappush(heap, (rank[u], u))
                k += 1
            u = heapq.heappop(heap)[1]
            t += cost[u]
            finish[u] = t
        done: dict[int, float] = {}
        for u, m in enumerate(members):
            for j in m:
                if finish[u] > done.get(j, -math.inf):
                    done[j] = finish[u]
        tail = worlds.tail_us[w]
        makespan = float(worlds.compute_makespan_us[w])
        for j, c in done.items():
            makespan = max(makespan, c + float(tail[j]))
        out.append(makespan)
    return out
