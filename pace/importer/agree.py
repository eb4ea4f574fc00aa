"""How far two traces of one model agree: ``pace profile``'s and ``pace import``'s, say.

Structure is compared exactly: the gradient tensors (names and bytes, and their order), the ops
as ``(phase, kind)`` in window order (names differ only in the module part: the execution trace
does not record module calls, see ``pace.importer.build.module_of``), each tensor's producer and
consumers as op positions, and the dependency edges. Timings are compared as per-phase totals
and as the iteration time the compiler predicts for each trace under the same cost model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from pace.ir import CommModel, Op, Trace

OpKey = tuple[str, int, str]  # (phase, position within the phase, kind)


def op_keys(trace: Trace) -> dict[str, OpKey]:
    """Each op's name -> (phase, its position among the ops of its phase, its kind)."""
    seen: dict[str, int] = {}
    out: dict[str, OpKey] = {}
    for op in trace.ops:
        k = seen.get(op.phase, 0)
        seen[op.phase] = k + 1
        # add_ and add are one kind: a composite op may take the in-place form in one run and
        # not in the other (matmul's bias under pace profile's dispatch mode).
        out[op.name] = (op.phase, k, op.name.rsplit(".", 1)[-1].rstrip("_"))
    return out


def phase_us(ops: Sequence[Op], phase: str) -> float:
    return sum(o.duration_us for o in ops if o.phase == phase)


@dataclass(frozen=True, kw_only=True, slots=True)
class Agreement:
    """``reference`` vs ``other``; ``*_us`` pairs are (reference, other)."""

    tensors_equal: bool  # the same names with the same byte sizes
    tensor_order_equal: bool
    ops_equal: bool  # the same (phase, kind) sequence
    links_equal: bool  # every tensor: the same producer and consumers (as op positions)
    deps_equal: bool  # the same dependency edges (as op positions)
    forward_us: tuple[float, float]
    backward_us: tuple[float, float]
    predicted_us: tuple[float, float]
    compute_speedup: float

    @staticmethod
    def rel(pair: tuple[float, float]) -> float:
        """(other - reference) / reference."""
        ref, other = pair
        return (other - ref) / ref if ref > 0 else float("inf")


def compare_traces(
    reference: Trace,
    other: Trace,
    *,
    comm: CommModel | None = None,
    compute_speedup: float = 1.0,
) -> Agreement:
    """Compare ``other`` with ``reference`` (module docstring). Both are compiled with ``comm``
    (default: the reference's cost model) and ``compute_speedup``, so that only their
    computation differs."""
    from pace.compiler import compile_trace

    ka, kb = op_keys(reference), op_keys(other)
    seq_a = [(p, kind) for p, _, kind in ka.values()]
    seq_b = [(p, kind) for p, _, kind in kb.values()]

    def links(trace: Trace, keys: dict[str, OpKey]) -> dict[str, tuple[OpKey, tuple[OpKey, ...]]]:
        return {
            t.name: (keys[t.producer], tuple(sorted(keys[c] for c in t.consumers)))
            for t in trace.tensors
        }

    def deps(trace: Trace, keys: dict[str, OpKey]) -> set[tuple[OpKey, OpKey]]:
        return {(keys[d], keys[o.name]) for o in trace.ops for d in o.deps}

    model = comm if comm is not None else reference.comm
    predicted = []
    for trace in (reference, other):
        result = compile_trace(
            dataclasses.replace(trace, comm=model),
            compute_speedup=compute_speedup,
            baselines=False,
        )
        predicted.append(result.predicted_iteration_us)
    return Agreement(
        tensors_equal={t.name: t.size_bytes for t in reference.tensors}
        == {t.name: t.size_bytes for t in other.tensors},
        tensor_order_equal=[t.name for t in reference.tensors] == [t.name for t in other.tensors],
        ops_equal=seq_a == seq_b,
        links_equal=seq_a == seq_b and links(reference, ka) == links(other, kb),
        deps_equal=seq_a == seq_b and deps(reference, ka) == deps(other, kb),
        forward_us=(phase_us(reference.ops, "forward"), phase_us(other.ops, "forward")),
        backward_us=(phase_us(reference.ops, "backward"), phase_us(other.ops, "backward")),
        predicted_us=(predicted[0], predicted[1]),
        compute_speedup=compute_speedup,
    )
