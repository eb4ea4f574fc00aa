"""Profile real PyTorch training iterations into a pace Trace; measure all-reduce cost.

Entry points: ``profile(model, step_fn, ...) -> Trace`` (``pace.profiler.api``),
``benchmark_allreduce(...) -> CommFit`` and ``what_if_comm(...)`` (``pace.profiler.comm``),
``build_workload(spec, ...)`` for the models ``pace profile --model`` names.
See docs/profiler.md.
"""

from __future__ import annotations

from pace.profiler.api import profile
from pace.profiler.comm import (
    CommFit,
    benchmark_allreduce,
    fit_comm,
    load_comm,
    save_comm,
    what_if_comm,
)
from pace.profiler.workloads import Workload, build_workload

__all__ = [
    "CommFit",
    "Workload",
    "benchmark_allreduce",
    "build_workload",
    "fit_comm",
    "load_comm",
    "profile",
    "save_comm",
    "what_if_comm",
]
