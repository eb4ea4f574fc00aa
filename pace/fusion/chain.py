"""The ready-time chain of all-reduces and the scheduling oracle over its contiguous partitions.

Alg. 1 (line 1) orders all all-reduces by ready time; Lemma 2 says fusing neighbours on that chain
delays a group's ready time least, so every plan here is a contiguous partition of the chain,
written as ``starts`` (index of each group's first tensor, ``starts[0] == 0``).

The oracle prices a partition as Alg. 1 line 6 does: the optimal preemptive schedule of the fused
jobs (``1 | r_j, pmtn | max(C_j + q_j)``, solved exactly by ``pace.lp.solve_exact``), with each
fused job costing one call, ``alpha + beta * bytes``. A fused group's release is its members'
latest release and its tail their largest tail (every consumer of every member waits for the whole
group), so after one reduction of the unfused trace each candidate costs only numpy ``reduceat``
plus one O(G log G) solve — no trace rebuilding, no graph work.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pace.errors import InputError
from pace.ir import FusionPlan, Trace

if TYPE_CHECKING:
    from pace.lp import ExactSolution

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# A user oracle prices a whole plan: (trace, plan) -> iteration time in us.
FusionOracle = Callable[[Trace, FusionPlan], float]


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Chain:
    """The trace's tensors in non-decreasing ready time (ties: smaller tail first, trace order).

    Ties in ready time (tensors of one producer) are ordered by tail so that a contiguous group
    collects tensors of similar urgency; the chain then runs from early, relaxed gradients to
    late, urgent ones, as in a backward pass.
    """

    names: tuple[str, ...]
    size_bytes: IntArray
    release_us: FloatArray
    tail_us: FloatArray
    compute_makespan_us: float
    alpha_us: float
    beta_us_per_byte: float
    # Where a group must start: each tensor whose fusion kind (element size and dtype) differs
    # from its predecessor's on the chain. The runtime all-reduces a fused unit as one buffer
    # of one dtype and refuses a unit that mixes them (a float16 body beside a float32 head).
    required_starts: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def n(self) -> int:
        return len(self.names)

    def legal(self, starts: IntArray) -> IntArray:
        """``starts`` with every required start added: no group mixes dtypes."""
        if self.required_starts.size == 0:
            return starts
        return np.union1d(starts, self.required_starts).astype(np.int64)

    def plan(self, starts: IntArray, *, method: str, details: dict[str, object]) -> FusionPlan:
        """The FusionPlan of partition ``starts`` (groups in chain order; ``legal``)."""
        bounds = [*self.legal(starts).tolist(), self.n]
        groups = tuple(tuple(self.names[a:b]) for a, b in itertools.pairwise(bounds))
        return FusionPlan(groups=groups, method=method, details=details)


def build_chain(trace: Trace) -> Chain:
    """Alg. 1 line 1: release and tail of every tensor from ``pace.lp``'s reduction, chained."""
    from pace.lp import reduction

    red = reduction(trace)
    release = np.asarray(red.release_us, dtype=np.float64)
    tail = np.asarray(red.tail_us, dtype=np.float64)
    size = np.asarray(red.size_bytes, dtype=np.int64)
    order = np.lexsort((np.arange(release.size), tail, release))
    names = tuple(trace.tensors[int(k)].name for k in order)
    # One integer per fusion kind (element size and dtype): a cut wherever neighbours differ.
    kind_ids: dict[tuple[int, str], int] = {}
    kind = np.asarray(
        [kind_ids.setdefault(trace.tensors[int(k)].fusion_kind, len(kind_ids)) for k in order],
        dtype=np.int64,
    )
    return Chain(
        names=names,
        size_bytes=size[order],
        release_us=release[order],
        tail_us=tail[order],
        compute_makespan_us=float(red.compute_makespan_us),
        alpha_us=float(trace.comm.alpha_us),
        beta_us_per_byte=float(trace.comm.beta_us_per_byte),
        required_starts=(np.flatnonzero(np.diff(kind)) + 1).astype(np.int64),
    )


Score = tuple[float, float]
"""``(iteration_us, lateness_us)``: the oracle's makespan, then, to order partitions of equal
makespan, the summed excess of every job's ``C_j + q_j`` over the compute-only makespan (the
search uses it to make progress on a plateau of several equally critical jobs)."""


# Relative tolerance for "this job is critical" and for "this move improves": float noise from a
# different summation order must not count as progress.
REL_EPS = 1e-9


@dataclass(kw_only=True, slots=True, eq=False)
class ChainOracle:
    """Prices contiguous partitions of ``chain`` (memoised; counts distinct evaluations).

    The default price is the optimal preemptive schedule of the fused jobs by
    ``pace.lp.solve_exact``. ``plan_oracle``, when given, replaces it (tests; or a simulator
    replay as the cost); it is much slower per call and gives the search no critical-path hints.
    """

    chain: Chain
    trace: Trace | None = None
    plan_oracle: FusionOracle | None = None
    evaluations: int = 0
    _memo: dict[bytes, Score] = field(default_factory=dict)
    _critical: dict[bytes, tuple[int, ...]] = field(default_factory=dict)

    def __call__(self, starts: IntArray) -> float:
        return self.score(starts)[0]

    def score(self, starts: IntArray) -> Score:
        starts = self.chain.legal(starts)
        key = partition_key(starts)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        self.evaluations += 1
        value = self._price(starts)
        self._memo[key] = value
        return value

    def critical_jobs(self, starts: IntArray) -> tuple[int, ...]:
        """Groups that run in a critical block of the oracle's schedule (empty when the schedule
        meets the compute-only bound, or under a plan oracle).

        A critical block (Carlier's bound) is the busy stretch of the channel that ends at a job
        with ``C_j + q_j`` equal to the makespan and runs only jobs at least as urgent; the
        makespan is ``r_B + sum(p_J) + q_j``, so only moves that touch these groups (merge them,
        split them, move their boundaries) can lower it. Computed on demand (the search asks only
        for partitions it accepted), by solving once more rather than keeping every schedule.
        """
        if self.plan_oracle is not None:
            return ()
        starts = self.chain.legal(starts)
        key = partition_key(starts)
        hit = self._critical.get(key)
        if hit is None:
            sol, finish, tail = self._solve(starts)
            makespan = float(sol.makespan_us)
            tol = REL_EPS * max(1.0, abs(makespan))
            hit = ()
            if makespan > self.chain.compute_makespan_us + tol:
                hit = _critical_blocks(sol.pieces, finish, tail, makespan - tol)
            self._critical[key] = hit
        return hit

    def _solve(self, starts: IntArray) -> tuple[ExactSolution, FloatArray, FloatArray]:
        from pace.lp import solve_exact

        c = self.chain
        release = np.maximum.reduceat(c.release_us, starts)
        tail = np.maximum.reduceat(c.tail_us, starts)
        size = np.add.reduceat(c.size_bytes, starts).astype(np.float64)
        duration = c.alpha_us + c.beta_us_per_byte * size
        sol = solve_exact(release, duration, tail, compute_makespan_us=c.compute_makespan_us)
        return sol, np.asarray(sol.completion_us) + tail, tail

    def _price(self, starts: IntArray) -> Score:
        if self.plan_oracle is not None:
            if self.trace is None:
                raise InputError("a plan oracle needs the trace", field="trace")
            plan = self.chain.plan(starts, method="candidate", details={})
            return float(self.plan_oracle(self.trace, plan)), 0.0
        sol, finish, _ = self._solve(starts)
        lateness = float(np.maximum(finish - self.chain.compute_makespan_us, 0.0).sum())
        return float(sol.makespan_us), lateness


def _critical_blocks(
    pieces: Sequence[tuple[int, float, float]],
    finish_us: FloatArray,
    tail_us: FloatArray,
    threshold_us: float,
) -> tuple[int, ...]:
    """Jobs of every critical block: walk back from each critical job's last piece while the
    channel stays busy with jobs at least as urgent."""
    last_piece: dict[int, int] = {}
    for i, (job, _, _) in enumerate(pieces):
        last_piece[job] = i
    jobs: set[int] = set()
    for j in np.flatnonzero(finish_us >= threshold_us).tolist():
        q = tail_us[j]
        i = last_piece[j]
        jobs.add(j)
        while i > 0:
            prev_job, _, prev_end = pieces[i - 1]
            start = pieces[i][1]
            if prev_end < start - REL_EPS * max(1.0, abs(start)) or tail_us[prev_job] < q:
                break
            jobs.add(prev_job)
            i -= 1
    return tuple(sorted(jobs))


def partition_key(starts: IntArray) -> bytes:
    """A 16-byte digest of a partition: memo keys stay small however long the chain is (a raw
    key of a 5,000-tensor chain is 40 kB, and the search prices thousands of partitions)."""
    return hashlib.blake2b(starts.tobytes(), digest_size=16).digest()


def starts_from_cuts(cuts: npt.NDArray[np.bool_]) -> IntArray:
    """Group starts from a boolean "a group starts here" mask (``cuts[0]`` must be True)."""
    return np.flatnonzero(cuts).astype(np.int64)


def singletons(n: int) -> IntArray:
    return np.arange(n, dtype=np.int64)


def validate_starts(starts: Sequence[int] | IntArray, n: int) -> IntArray:
    arr = np.asarray(starts, dtype=np.int64)
    if arr.ndim != 1 or arr.size == 0 or arr[0] != 0 or arr[-1] >= n or np.any(np.diff(arr) <= 0):
        raise InputError(
            "must begin at 0 and increase strictly below the chain length", field="starts"
        )
    return arr
