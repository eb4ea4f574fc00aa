"""``recompile``: the offline equivalent of the runtime's drift loop (``pace recompile``).

A run dumps its observed statistics (``Monitor.dump`` -> ``stats.json``); this re-estimates the
trace from them, compiles a schedule for the re-estimated trace and, if the schedule that was
running is given, predicts both on the new estimate and applies the same gain rule as the
online trigger.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pace.drift.estimate import (
    Estimate,
    EstimateOptions,
    ObservedStats,
    apply_estimate,
    estimate,
)
from pace.drift.trigger import TriggerOptions
from pace.errors import ScheduleMismatchError
from pace.ir import Schedule, Trace
from pace.options import FusionMethod, Solver

__all__ = ["RecompileResult", "recompile"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RecompileResult:
    schedule: Schedule
    """Compiled for ``trace`` (its digest is the re-estimated trace's)."""
    trace: Trace
    """The re-estimated trace."""
    estimate: Estimate
    predicted_iteration_us: float
    compile_seconds: float
    current_us: float | None = None
    """The running schedule replayed on the re-estimated trace (if it was given)."""
    gain: float | None = None
    """``(current_us - predicted_iteration_us) / current_us``."""
    switch: bool | None = None
    """Whether the online trigger would switch (gain above its threshold)."""


def recompile(
    trace: Trace,
    stats: ObservedStats,
    *,
    current: Schedule | None = None,
    fusion: FusionMethod = "search",
    solver: Solver = "exact",
    estimate_options: EstimateOptions | None = None,
    trigger_options: TriggerOptions | None = None,
) -> RecompileResult:
    """Re-estimate ``trace`` from ``stats`` and compile a schedule for it.

    Raises ``ScheduleMismatchError`` if ``stats`` (or ``current``) names a trace digest other
    than ``trace``'s: an estimate relative to the wrong trace would be meaningless.
    """
    from pace.compiler import compile_trace
    from pace.drift.replan import predict_schedule
    from pace.io import trace_digest
    from pace.verify import verify_schedule

    digest = trace_digest(trace)
    if stats.trace_digest and stats.trace_digest != digest:
        raise ScheduleMismatchError(
            f"observed statistics are of trace {stats.trace_digest[:16]}..., "
            f"not of this trace ({digest[:16]}...)",
            field="trace_digest",
        )
    if current is not None:
        verify_schedule(current, trace, where="current schedule")
    est = estimate(trace, stats, estimate_options, running=current)
    new_trace = apply_estimate(trace, est)
    t0 = time.perf_counter()
    result = compile_trace(new_trace, fusion=fusion, solver=solver, baselines=False)
    seconds = time.perf_counter() - t0
    predicted = float(result.predicted_iteration_us)
    current_us: float | None = None
    gain: float | None = None
    switch: bool | None = None
    if current is not None:
        current_us = predict_schedule(new_trace, current)
        opts = trigger_options if trigger_options is not None else TriggerOptions()
        gain = (current_us - predicted) / current_us if current_us > 0 else 0.0
        switch = gain > opts.gain_threshold
    return RecompileResult(
        schedule=result.schedule,
        trace=new_trace,
        estimate=est,
        predicted_iteration_us=predicted,
        compile_seconds=seconds,
        current_us=current_us,
        gain=gain,
        switch=switch,
    )
