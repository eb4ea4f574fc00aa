"""The trace digest: which computation a schedule was compiled for (docs/trace-format.md).

A schedule file names its trace by this digest (``trace_digest``), ``pace.verify`` compares the
two, the drift monitor records it. Kept apart from ``pace.io`` (which re-exports it) so that
``pace.verify`` and ``pace.io`` do not import each other. Imports only ``ir`` and ``errors``.
"""

from __future__ import annotations

import hashlib
import json

from pace.errors import InputError
from pace.ir import Trace

__all__ = ["DIGEST_PREFIX", "trace_digest"]

DIGEST_PREFIX = "sha256:"


def trace_digest(trace: Trace) -> str:
    """``"sha256:<hex>"`` over the computation a schedule is compiled for.

    Covered, in trace order: every op's ``name``, ``phase``, ``duration_us`` and ``deps`` (in
    order), and every tensor's ``name``, ``bytes``, ``producer`` and ``consumers`` (in order).
    Not covered: ``model``, ``meta`` and ``comm``. The communication model is left out on
    purpose: a schedule records the model it was compiled for in its own ``cost_model`` (which a
    what-if compile changes legitimately), so the digest answers only "same graph, same
    tensors, same durations?". The digest is independent of JSON key order, whitespace, gzip
    and of how a number is spelled (``10`` and ``10.0`` hash alike: numbers are hashed as
    float64 ``repr``), but it does change when ops or tensors are listed in another order: list
    order is what a profiler emits and what tie-breaking in the compiler sees.

    The hashed text is the canonical JSON (sorted keys, no spaces) of
    ``{"digest": "pace.trace/1", "ops": [[name, phase, duration_us, [deps]], ...],
    "tensors": [[name, bytes, producer, [consumers]], ...]}`` (``element_bytes`` appended to a
    tensor's list when it is not 1, then its ``dtype`` when recorded).
    """
    payload = {
        "digest": "pace.trace/1",
        "ops": [[op.name, op.phase, float(op.duration_us), list(op.deps)] for op in trace.ops],
        # element_bytes and dtype join a tensor's entry only when known (!= 1, != ""): they
        # constrain valid schedules, and leaving them out otherwise keeps the digests of older
        # traces unchanged.
        "tensors": [
            [t.name, int(t.size_bytes), t.producer, list(t.consumers)]
            + ([int(t.element_bytes)] if t.element_bytes != 1 else [])
            + ([t.dtype] if t.dtype else [])
            for t in trace.tensors
        ],
    }
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise InputError("cannot digest a trace with non-finite durations") from None
    return DIGEST_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()
