"""Every closed set of option names, defined once.

Each set is a ``Literal`` type (for annotations: mypy checks a literal argument) and the tuple of
its values derived from it with ``typing.get_args`` (for runtime checks, error messages and the
CLI's ``choices=``), so the two cannot disagree. A module that accepts one of these options
imports both from here instead of spelling the values again; the order of each tuple is the
order messages and ``--help`` list them in, the first value being no default by itself.

This module imports nothing from pace (docs/design.md, "Who may import whom").
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "COMM_BENCH_BACKENDS",
    "DRIFT_EVENT_KINDS",
    "FUSION_METHODS",
    "IMPORT_TIMINGS",
    "LP_BACKENDS",
    "MAXMIN_ALGORITHMS",
    "PHASES",
    "POLICY_NAMES",
    "PROFILE_TIMINGS",
    "RUNTIME_BACKENDS",
    "SCHEDULE_MODES",
    "SOLVERS",
    "TIMELINE_FORMATS",
    "CommBenchBackend",
    "DriftEventKind",
    "FusionMethod",
    "ImportTiming",
    "LpBackend",
    "MaxMinAlgorithm",
    "Phase",
    "PolicyName",
    "ProfileTiming",
    "RuntimeBackend",
    "ScheduleMode",
    "Solver",
    "TimelineFormat",
]

# -- the IR ------------------------------------------------------------------------------------

Phase = Literal["forward", "backward", "optimizer", "other"]
"""An op's phase in the iteration window (docs/trace-format.md)."""
PHASES: tuple[Phase, ...] = get_args(Phase)

# How the training loop meets its gradients (docs/schedule-format.md, "mode"): "overlap" applies
# each update as soon as its gradient is reduced, so the next forward overlaps communication;
# "sync" returns from backward() with every gradient reduced (DDP's contract), so the next
# forward waits for all of them.
ScheduleMode = Literal["overlap", "sync"]
SCHEDULE_MODES: tuple[ScheduleMode, ...] = get_args(ScheduleMode)

# -- the compiler ------------------------------------------------------------------------------

FusionMethod = Literal["search", "paper", "none"]
"""``pace.fusion.plan_fusion(method=)``, ``pace compile --fusion``: search (beyond PACE Alg. 1),
paper (Alg. 1), none (one all-reduce per tensor)."""
FUSION_METHODS: tuple[FusionMethod, ...] = get_args(FusionMethod)

MaxMinAlgorithm = Literal["auto", "dp", "bisect"]
"""The MaxMinSize algorithm of the fusion (``pace.fusion.maxmin``): the paper's DP table, the
bisection, or auto (DP up to ``pace.fusion.paper.DP_MAX_TENSORS`` tensors)."""
MAXMIN_ALGORITHMS: tuple[MaxMinAlgorithm, ...] = get_args(MaxMinAlgorithm)

Solver = Literal["exact", "lp"]
"""``pace.lp.schedule(solver=)``, ``pace compile --solver``."""
SOLVERS: tuple[Solver, ...] = get_args(Solver)

LpBackend = Literal["highs", "cbc", "scipy"]
"""The LP solver behind ``solver="lp"`` (``pace.lp.model``)."""
LP_BACKENDS: tuple[LpBackend, ...] = get_args(LpBackend)

# -- the simulator -----------------------------------------------------------------------------

PolicyName = Literal[
    "fifo",
    "horovod",
    "horovod-old",
    "ddp",
    "tictac",
    "p3",
    "bytescheduler",
    "bytescheduler-tuned",
]
"""The baseline policies ``pace.sim.POLICIES`` registers, in the order ``pace compare`` runs
them (``tests/test_options.py`` holds the registry to this list)."""
POLICY_NAMES: tuple[PolicyName, ...] = get_args(PolicyName)

TimelineFormat = Literal["png", "chrome"]
"""``pace timeline --format``: a Gantt chart or a Chrome/Perfetto trace."""
TIMELINE_FORMATS: tuple[TimelineFormat, ...] = get_args(TimelineFormat)

# -- profiling and importing -------------------------------------------------------------------

ProfileTiming = Literal["span", "kernel"]
"""``pace profile --timing``: an op owns the wall time to the next op, or its time inside."""
PROFILE_TIMINGS: tuple[ProfileTiming, ...] = get_args(ProfileTiming)

ImportTiming = Literal["span", "kernel", "device"]
"""``pace import --timing``: the profiler's two plus the GPU kernel time."""
IMPORT_TIMINGS: tuple[ImportTiming, ...] = get_args(ImportTiming)

CommBenchBackend = Literal["gloo", "horovod"]
"""``pace profile-comm --backend``: who runs the timed all-reduces."""
COMM_BENCH_BACKENDS: tuple[CommBenchBackend, ...] = get_args(CommBenchBackend)

# -- runtime and drift -------------------------------------------------------------------------

HOROVOD_RUNTIME_ENV = {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CACHE_CAPACITY": "0"}
"""The Horovod settings the runtime's replay needs (read once by ``hvd.init()``): fusion and
the response cache off, so Horovod neither regroups nor reorders the scheduled all-reduces.
``pace profile-comm --backend horovod`` measures the calls under them; ``--framework`` also
under Horovod's defaults (these unset), vanilla Horovod's path."""

RuntimeBackend = Literal["horovod", "torch"]
"""``pace.runtime.wrap(backend=)``."""
RUNTIME_BACKENDS: tuple[RuntimeBackend, ...] = get_args(RuntimeBackend)

DriftEventKind = Literal["fired", "failed", "switched", "kept"]
"""``pace.drift.DriftEvent.kind``: the trigger fired; the re-estimate or compile failed; a new
schedule was adopted; the current one was kept."""
DRIFT_EVENT_KINDS: tuple[DriftEventKind, ...] = get_args(DriftEventKind)
