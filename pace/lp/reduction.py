"""Reduce a trace + fusion plan to a one-machine scheduling instance (PACE Sec. IV-B).

Each all-reduce job (a fusion group; one tensor per job without fusion) becomes a job of
``1 | r_j, pmtn | max(C_j + q_j)``:

* **release** ``r_j``: when the job's last member tensor is produced. By the paper's Lemma 1 no
  producer depends on any all-reduce, so this is the producer's finish time under ideal compute
  with no communication at all — a plain longest-path value of the op DAG.
* **tail** ``q_j``: the longest computation path that starts at a consumer of the job and runs to
  the end of the window (consumer's own duration included). Theorem 1: the window's makespan is
  ``max(compute-only makespan, max_j C_j + q_j)`` where ``C_j`` is the job's completion time.
  For a fused group the tail is the maximum over all members' consumers, since every consumer of
  every member waits for the whole group.

A tensor without consumers gets tail 0: its all-reduce must still end inside the window.

The per-tensor values come from the trace's one analysis (``pace.analysis``), computed once per
trace object: the fusion search asks for many plans of the same trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from pace.analysis import TraceAnalysis, analyze
from pace.errors import InputError
from pace.ir import FusionPlan, Trace

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class TensorTiming:
    """Per-tensor release and tail, in the trace's tensor order (plan independent)."""

    names: tuple[str, ...]
    release_us: FloatArray
    tail_us: FloatArray
    size_bytes: IntArray
    need_us: FloatArray  # compute-only start of the earliest consumer (inf: no consumer)
    compute_makespan_us: float
    index: Mapping[str, int]
    element_bytes: IntArray  # partitions of tensor k start and end on multiples of this
    analysis: TraceAnalysis


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Reduction:
    """The scheduling instance of one (trace, plan) pair; job ``j`` is ``plan.groups[j]``.

    ``duration_us`` is the all-reduce time of the whole job as one call under the trace's cost
    model (``alpha + beta * size``). Arrays are read-only.
    """

    jobs: tuple[tuple[str, ...], ...]
    release_us: FloatArray
    tail_us: FloatArray
    size_bytes: IntArray
    duration_us: FloatArray
    compute_makespan_us: float
    tensors: TensorTiming

    @property
    def n_jobs(self) -> int:
        return len(self.jobs)


_A = TypeVar("_A", bound="np.ndarray[Any, Any]")


def _frozen(a: _A) -> _A:
    a.setflags(write=False)
    return a


def tensor_timing(trace: Trace) -> TensorTiming:
    """Release and tail of every tensor of ``trace``: ``pace.analysis``'s values as arrays
    (kept with the trace's analysis, so the fusion search's many plans share them).

    Raises ``InputError`` on an unknown op name, a dependency cycle, or a producer that depends
    (directly or transitively) on a consumer — the Lemma-1 rule the reduction relies on.
    """
    return analyze(trace).memo("lp.tensor_timing", _timing_arrays)


def _timing_arrays(an: TraceAnalysis) -> TensorTiming:
    return TensorTiming(
        names=an.tensor_names,
        release_us=_frozen(np.asarray(an.release_us, dtype=np.float64)),
        tail_us=_frozen(np.asarray(an.tail_us, dtype=np.float64)),
        size_bytes=_frozen(np.asarray(an.size_bytes, dtype=np.int64)),
        need_us=_frozen(np.asarray(an.need_us, dtype=np.float64)),
        compute_makespan_us=an.critical_path_us,
        index=an.tensor_index,
        element_bytes=_frozen(np.asarray(an.element_bytes, dtype=np.int64)),
        analysis=an,
    )


def reduction(trace: Trace, plan: FusionPlan | None = None) -> Reduction:
    """The scheduling instance of ``trace`` under fusion ``plan`` (no fusion if ``None``).

    >>> from pace.synth import random_trace
    >>> red = reduction(random_trace(seed=1, n_layers=3, integer=True))
    >>> red.n_jobs == len(red.release_us) == len(red.tail_us)
    True
    """
    timing = tensor_timing(trace)
    if plan is None:
        jobs: tuple[tuple[str, ...], ...] = tuple((n,) for n in timing.names)
        release = timing.release_us.copy()
        tail = timing.tail_us.copy()
        size = timing.size_bytes.copy()
    else:
        jobs = tuple(tuple(g) for g in plan.groups)
        seen: set[str] = set()
        n_j = len(jobs)
        release = np.empty(n_j, dtype=np.float64)
        tail = np.empty(n_j, dtype=np.float64)
        size = np.empty(n_j, dtype=np.int64)
        for j, group in enumerate(jobs):
            if not group:
                raise InputError("empty fusion group", field=f"groups[{j}]")
            members = []
            for name in group:
                k = timing.index.get(name)
                if k is None:
                    raise InputError(f"tensor {name!r} does not exist", field=f"groups[{j}]")
                if name in seen:
                    raise InputError(f"tensor {name!r} in two groups", field=f"groups[{j}]")
                seen.add(name)
                members.append(k)
            m = np.asarray(members)
            release[j] = timing.release_us[m].max()
            tail[j] = timing.tail_us[m].max()
            size[j] = timing.size_bytes[m].sum()
        if len(seen) != len(timing.names):
            missing = next(n for n in timing.names if n not in seen)
            raise InputError(f"tensor {missing!r} is in no group", field="groups")
    comm = trace.comm
    duration = comm.alpha_us + comm.beta_us_per_byte * size.astype(np.float64)
    return Reduction(
        jobs=jobs,
        release_us=_frozen(release),
        tail_us=_frozen(tail),
        size_bytes=_frozen(size),
        duration_us=_frozen(duration),
        compute_makespan_us=timing.compute_makespan_us,
        tensors=timing,
    )
