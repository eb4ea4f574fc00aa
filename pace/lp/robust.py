"""Jittered replay: how a compiled schedule behaves when op durations wobble.

An optimal preemptive schedule is timed to the microsecond: a partition ends exactly where a
later, more urgent gradient is released. If that gradient is ready a hair late, the contract's
work-conserving replay starts the next (large) piece of the preempted job, and the urgent one
waits behind it — head-of-line blocking. The runtime does not do that: it issues strictly in
priority order (the nominal replay's start order, ``pace.compiler.in_issue_order``) and waits
for the late gradient, which costs only its lateness. So the worlds here are replayed in the
runtime's order (:func:`jittered_replays_us`), where the nominal schedule turns out robust
already (docs/scheduling.md section 8). The robust selection in :func:`pace.lp.schedule` scores
candidates by their mean replay over a few jittered copies of the trace (every op duration times
an independent lognormal factor, fixed seed: ``pace.jitter.JitterModel(op_sd=...)``, the model
drift re-planning also judges switches with) and keeps the nominal guarantees by only choosing
among candidates whose nominal replay is within a small tolerance of the best.

By Lemma 1 the channel's behaviour depends only on when tensors are produced, so a jittered world
is just new tensor releases, tails and compute makespan: one forward and one backward sweep over
the op DAG, vectorised across all worlds at once (numpy arrays of one value per world per op).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from pace.analysis import TraceAnalysis, analyze, compute_sweeps
from pace.errors import InputError
from pace.ir import Trace, Unit
from pace.jitter import JitterModel
from pace.lp.candidates import PieceCandidate, replay_us
from pace.lp.reduction import Reduction
from pace.lp.units import units_from_pieces
from pace.replay import (
    index_units,
    issue_ready_us,
    serial_replay,
    start_order,
    tensor_done_us,
    unit_copies,
    updated_us,
    window_us,
)

__all__ = [
    "ROBUST_FULL_MAX_JOBS",
    "ROBUST_SAMPLES",
    "ROBUST_SD",
    "ROBUST_SEED",
    "ROBUST_TOLERANCE",
    "JitterWorlds",
    "RobustChoice",
    "RobustOption",
    "jitter_worlds",
    "jittered_replays_us",
    "robust_choice",
    "select_robust",
]

ROBUST_SAMPLES = 8
"""Jittered worlds each candidate is replayed on."""
ROBUST_SD = 0.02
"""Standard deviation of the log of each op's duration factor (about 2% jitter)."""
ROBUST_SEED = 0
ROBUST_TOLERANCE = 0.005
"""A robust choice may be at most this much (relative) slower nominally than the best."""

FloatArray = npt.NDArray[np.float64]
# Budget of unit replays (units x worlds, summed over candidates) for the robust selection:
# every admissible candidate at small N, the best few by nominal replay at large N, where one
# jittered replay of thousands of units is tens of milliseconds.
_ROBUST_BUDGET = 400_000
_ROBUST_MIN_POOL = 4
# Above this many jobs the robust search is trimmed (a shorter ladder, the best two candidates
# only) to keep compile time within the documented goals (< 10 s at 5,000 tensors).
ROBUST_FULL_MAX_JOBS = 1000
P = TypeVar("P")


@dataclass(frozen=True, kw_only=True, slots=True)
class RobustOption(Generic[P]):
    """One choice the robust selection may make: its nominal replay, its mean jittered replay
    (computed only if it is admissible: it costs a replay per world), and a tie-break rank."""

    nominal_us: float
    mean_us: Callable[[], float]
    rank: float
    payload: P


@dataclass(frozen=True, kw_only=True, slots=True)
class RobustChoice:
    """What the robust selection decided, next to the nominal choice it replaced."""

    samples: int
    tolerance: float
    jitter_mean_us: float
    nominal_choice: str
    nominal_choice_us: float
    nominal_choice_jitter_mean_us: float

    def as_meta(self) -> dict[str, Any]:
        """The schedule file's ``meta.robust`` object."""
        return {
            "samples": self.samples,
            "tolerance": self.tolerance,
            "jitter_mean_us": self.jitter_mean_us,
            "nominal_choice": self.nominal_choice,
            "nominal_choice_us": self.nominal_choice_us,
            "nominal_choice_jitter_mean_us": self.nominal_choice_jitter_mean_us,
        }


def select_robust(
    nominal: RobustOption[P], others: Sequence[RobustOption[P]], limit_us: float
) -> tuple[RobustOption[P], float]:
    """The robust selection, the one rule every level applies: among ``nominal`` (the nominal
    choice, always admissible) and the ``others`` whose nominal replay is at most ``limit_us``,
    the option with the best mean jittered replay; ties go to the better nominal replay, then
    the lower rank. Returns the option and its mean.

    The caller sets ``limit_us`` from its guarantees: within the tolerance of the best nominal
    replay, and never above a reference it must not lose to.
    """
    best = nominal
    best_key = (nominal.mean_us(), nominal.nominal_us, nominal.rank)
    for opt in others:
        if opt.nominal_us > limit_us:
            continue
        key = (opt.mean_us(), opt.nominal_us, opt.rank)
        if key < best_key:
            best, best_key = opt, key
    return best, best_key[0]


@dataclass(frozen=True, kw_only=True, slots=True)
class JitterWorlds:
    """Per-world tensor timing: ``release_us[w, k]``, ``tail_us[w, k]`` (tensor ``k`` in trace
    order), ``compute_makespan_us[w]``, and the analysis of the nominal trace."""

    release_us: FloatArray
    tail_us: FloatArray
    compute_makespan_us: FloatArray
    analysis: TraceAnalysis

    @property
    def samples(self) -> int:
        return int(self.compute_makespan_us.shape[0])


def jitter_worlds(
    trace: Trace,
    *,
    samples: int = ROBUST_SAMPLES,
    sd: float = ROBUST_SD,
    seed: int = ROBUST_SEED,
) -> JitterWorlds:
    """Tensor releases and tails of ``samples`` jittered copies of ``trace`` (kept with the
    trace's analysis).

    Deterministic: the factors come from ``numpy.random.default_rng(seed)``.

    >>> from pace.synth import random_trace
    >>> w = jitter_worlds(random_trace(seed=1, n_layers=3), samples=4)
    >>> w.release_us.shape[0], w.samples
    (4, 4)
    """
    if samples < 1:
        raise InputError(f"must be >= 1, got {samples}", field="samples")
    if not (sd >= 0 and math.isfinite(sd)):
        raise InputError(f"must be a finite number >= 0, got {sd!r}", field="sd")
    an = analyze(trace)
    return an.memo(("lp.jitter_worlds", samples, sd, seed), lambda a: _worlds(a, samples, sd, seed))


def _worlds(an: TraceAnalysis, samples: int, sd: float, seed: int) -> JitterWorlds:
    trace = an.trace
    base = np.asarray(an.duration_us, dtype=np.float64)
    # The project's one jitter model (pace.jitter), per-op factors only.
    dur = base[:, None] * JitterModel(op_sd=sd, samples=samples, seed=seed).op_factors(trace)
    # The one compute-only sweep (pace.analysis), one value per world per op.
    _, finish, from_start = compute_sweeps(
        an.topo, an.deps, an.children, list(dur), zero=np.zeros(samples), maximum=np.maximum
    )
    n_t = len(an.tensor_names)
    release = np.empty((samples, n_t))
    tail = np.zeros((samples, n_t))
    for k, p in enumerate(an.producer):
        release[:, k] = finish[p]
        for c in an.consumers[k]:
            tail[:, k] = np.maximum(tail[:, k], from_start[c])
    makespan = np.max(np.stack(finish), axis=0) if finish else np.zeros(samples)
    return JitterWorlds(
        release_us=release,
        tail_us=tail,
        compute_makespan_us=makespan,
        analysis=an,
    )


def jittered_replays_us(worlds: JitterWorlds, units: Sequence[Unit]) -> list[float]:
    """The runtime's replay of ``units`` in every world: the one kernel (``pace.replay``) with
    each world's releases, then Theorem 1 with its tails.

    The runtime issues strictly in priority order, and ``pace compile`` numbers the units in the
    order the nominal replay starts them (``pace.compiler.in_issue_order``). So a world replays
    them in that order, each once its tensors are released there and every unit before it has
    been sent (``pace.sim.schedule_policy(..., in_order=True)`` on the jittered trace). A unit
    released late then holds back the ones after it, where the contract's work-conserving replay
    would send a later unit first.
    """
    arrays = index_units(worlds.analysis, units)
    nominal_start, _ = serial_replay(arrays.ready_us, arrays.cost_us, arrays.priority)
    order = start_order(nominal_start, arrays.priority)
    rank = [0.0] * len(order)
    for pos, u in enumerate(order):
        rank[u] = float(pos)
    sizes = worlds.analysis.size_bytes
    per_byte = worlds.analysis.trace.comm.update_us_per_byte
    out: list[float] = []
    for w in range(worlds.samples):
        rel = worlds.release_us[w].tolist()
        ready = issue_ready_us([max(rel[k] for k in members) for members in arrays.tensors], order)
        _, finish = serial_replay(ready, arrays.cost_us, rank)
        done = updated_us(
            tensor_done_us(arrays, finish), sizes, per_byte, unit_copies(arrays, finish)
        )
        out.append(
            window_us(float(worlds.compute_makespan_us[w]), done, worlds.tail_us[w].tolist())
        )
    return out


_Choice = tuple[PieceCandidate, tuple[Unit, ...]]


def robust_choice(  # noqa: PLR0917 (the scheduler's one call site)
    red: Reduction,
    cands: list[PieceCandidate],
    worlds: JitterWorlds,
    nominal: tuple[float, PieceCandidate, tuple[Unit, ...]],
    tolerance: float,
    reference: tuple[float, tuple[Unit, ...], str],
) -> tuple[float, PieceCandidate, tuple[Unit, ...], RobustChoice]:
    """``select_robust`` over this plan's candidates: nominally within ``tolerance`` of the best
    and no worse than the FIFO / need-order candidates and the best baseline ``reference`` the
    compiler handed in (its replay, units and name), whose own units are an option too (P3's
    fixed-size slices are robust by nature)."""
    best_us, best_cand, best_units_ = nominal
    ref_us, ref_units, ref_name = reference
    limit = min(best_us * (1.0 + tolerance), ref_us)
    # Never nominally worse than a baseline's own order (the schedule's guarantees).
    for c in cands:
        if c.name in ("fifo-order", "need-order") or c.name.startswith("baseline-"):
            limit = min(limit, c.replay_us)
    limit = max(limit, best_us)

    def mean_of(units: tuple[Unit, ...]) -> Callable[[], float]:
        return functools.cache(lambda: sum(jittered_replays_us(worlds, units)) / worlds.samples)

    first: RobustOption[_Choice] = RobustOption(
        nominal_us=best_us, mean_us=mean_of(best_units_), rank=-1, payload=(best_cand, best_units_)
    )
    others: list[RobustOption[_Choice]] = []
    seen = {best_units_}
    pool = sorted(
        (c for c in cands if c.pieces and c.replay_us <= limit), key=lambda c: c.replay_us
    )
    per_cand = max(1, len(best_units_) * worlds.samples)
    n_pool = max(_ROBUST_MIN_POOL, _ROBUST_BUDGET // per_cand)
    if red.n_jobs > ROBUST_FULL_MAX_JOBS:
        n_pool = 2
    for cand in pool[:n_pool]:
        units = units_from_pieces(red, cand.pieces)
        if units not in seen:
            seen.add(units)
            others.append(
                RobustOption(
                    nominal_us=replay_us(red, units),
                    mean_us=mean_of(units),
                    rank=len(others),
                    payload=(cand, units),
                )
            )
    if ref_units and ref_units not in seen:
        ref_cand = PieceCandidate(name=f"baseline-{ref_name}", pieces=(), replay_us=ref_us)
        others.append(
            RobustOption(
                nominal_us=ref_us,
                mean_us=mean_of(ref_units),
                rank=len(others),
                payload=(ref_cand, ref_units),
            )
        )
    pick, mean_us = select_robust(first, others, limit)
    cand, units = pick.payload
    choice = RobustChoice(
        samples=worlds.samples,
        tolerance=tolerance,
        jitter_mean_us=mean_us,
        nominal_choice=best_cand.name,
        nominal_choice_us=best_us,
        nominal_choice_jitter_mean_us=first.mean_us(),
    )
    return pick.nominal_us, cand, units, choice
