"""Discrete-event simulator of one training iteration window, and the baseline policies.

Public entry: :func:`simulate` (``trace, policy, *, options -> SimResult``). The default mode is
the replay semantics of docs/schedule-format.md, which defines a schedule's
``predicted_iteration_us``.
"""

from pace.sim.core import (
    CycleFusion,
    Decision,
    Policy,
    SimOptions,
    SimResult,
    covered_us,
    merge_intervals,
    schedule_policy,
    units_policy,
)
from pace.sim.policies import (
    POLICIES,
    compare,
    layer_order,
    ready_order,
    runtime_replay_us,
    simulate,
)

__all__ = [
    "POLICIES",
    "CycleFusion",
    "Decision",
    "Policy",
    "SimOptions",
    "SimResult",
    "compare",
    "covered_us",
    "layer_order",
    "merge_intervals",
    "ready_order",
    "runtime_replay_us",
    "schedule_policy",
    "simulate",
    "units_policy",
]
