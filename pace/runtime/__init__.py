"""Replay a compiled schedule in real data-parallel training (Horovod or torch.distributed).

One line::

    opt = pace.runtime.wrap(optimizer, model, schedule="model.schedule.json", backend="horovod")

Gradient hooks only mark tensors ready; a dispatcher thread issues the schedule's units in their
compiled order (partitions in place, fusion groups through one flat buffer); each parameter is
updated as soon as its gradient is reduced, and each module's forward waits only for its own
parameters. ``schedule=None`` runs ByteScheduler's online algorithm on the same machinery.
See docs/runtime.md.

Imports neither pulp, scipy nor networkx (the compiler's dependencies); torch is imported here,
Horovod only when the Horovod backend is used.
"""

from __future__ import annotations

from pace.runtime.engine import pack_pieces, unpack_pieces
from pace.runtime.optimizer import (
    ONLINE_CREDIT_BYTES,
    PaceOptimizer,
    RuntimeOptions,
    wrap,
    wrapped_params,
)
from pace.runtime.plan import (
    ParamInfo,
    Piece,
    PlanUnit,
    ReplayPlan,
    partition_params,
    plan_from_schedule,
    wfbp_plan,
)

__all__ = [
    "ONLINE_CREDIT_BYTES",
    "PaceOptimizer",
    "ParamInfo",
    "Piece",
    "PlanUnit",
    "ReplayPlan",
    "RuntimeOptions",
    "pack_pieces",
    "partition_params",
    "plan_from_schedule",
    "unpack_pieces",
    "wfbp_plan",
    "wrap",
    "wrapped_params",
]
