"""Drift: monitor real iterations, re-estimate the trace, recompile, switch on every rank together.

Modules (each importable without torch, pulp or scipy, so the runtime can keep the monitor on):

* ``monitor``: O(1)-per-event ring buffers the runtime's hooks feed;
* ``estimate``: observed statistics (``ObservedStats``, the ``stats.json`` file) -> a re-estimated
  trace (per-phase compute scale, refitted alpha/beta), median over a window;
* ``trigger``: AutoByte-style hysteresis (10% deviation for K iterations to re-estimate, 5% gain
  to switch, cool-down);
* ``loop``: what ``pace.runtime.wrap(..., drift=True)`` runs: the monitor, rank 0's controller
  and the switch protocol at every iteration boundary, with a log line per decision;
* ``replan``: background recompile, rank 0's controller, and the broadcast protocol that makes
  every rank switch at the same iteration boundary;
* ``tune``: Bayesian optimisation of the ByteScheduler and Horovod baselines' knobs on the
  simulator (scikit-optimize), so comparisons are against their best-tuned versions.
"""

from __future__ import annotations

from pace.drift.estimate import (
    Estimate,
    EstimateOptions,
    Estimator,
    IterationStats,
    ObservedStats,
    apply_estimate,
    estimate,
    reestimate,
)
from pace.drift.loop import DriftLoop, DriftOptions
from pace.drift.monitor import Monitor
from pace.drift.replan import (
    DriftController,
    DriftEvent,
    JitterPredictor,
    Recompiled,
    ReplanError,
    Replanner,
    SwitchProtocol,
    decode_switch,
    encode_switch,
)
from pace.drift.trigger import DriftTrigger, TriggerOptions, TriggerState

__all__ = [
    "DriftController",
    "DriftEvent",
    "DriftLoop",
    "DriftOptions",
    "DriftTrigger",
    "Estimate",
    "EstimateOptions",
    "Estimator",
    "IterationStats",
    "JitterPredictor",
    "Monitor",
    "ObservedStats",
    "Recompiled",
    "ReplanError",
    "Replanner",
    "SwitchProtocol",
    "TriggerOptions",
    "TriggerState",
    "apply_estimate",
    "decode_switch",
    "encode_switch",
    "estimate",
    "reestimate",
]
