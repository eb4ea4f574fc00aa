"""Split an execution trace into training steps and each step into its forward and backward ops.

**Steps.** ``torch.profiler`` marks each step with a ``ProfilerStep#N`` scope. Node ids are
given when a call starts, across threads, so step N holds the nodes from its scope's id to the
next step's (the autograd engine runs GPU work on its own thread, outside the scope's call tree).
A trace without steps (an observer started and stopped by hand around one step) is one step.
Times come from the Kineto trace (``pace.importer.timing``).

**Phases**, matching ``pace profile`` (docs/profiler.md), whose forward pass is the step function
and whose backward pass is ``loss.backward()``:

* *backward*: autograd nodes (``scope`` 1, or the child of ``autograd::engine::evaluate_function:
  NAME`` called NAME) and every op inside the engine's ``evaluate_function`` scopes;
  ``AccumulateGrad`` nodes mark when each gradient is ready and are not ops of the trace, as in
  ``pace profile``; so is the gradient seed (``ones_like``) that ``loss.backward()`` makes;
* *forward*: the ops of the step that start before the first autograd node runs;
* neither: the optimizer's ``Optimizer.step#...`` / ``Optimizer.zero_grad#...`` scopes, data
  loading (``enumerate(DataLoader)#...``), the recording helper's ``pace::`` markers, and ops after
  backward (gradient clipping, logging). The optimizer's time goes to ``meta.optimizer_us``.

**Op granularity.** ``pace profile`` records the first op below autograd: a composite op such as
``aten::linear`` appears as its parts (``t``, ``addmm``). The execution trace records the whole
call tree; the operators that autograd saw have an autograd sequence number (``seq_id``), the
calls inside their kernels have none. A composite op records the number its first autograd call
then takes, so the forward ops are the operators with no descendant of their own number: ``t`` and
``addmm``, not ``linear`` nor ``addmm``'s own calls. A sequenced call inside such an op is an op
too (the ``clone`` an in-place op's autograd kernel makes of its input), and its own work comes
first (``CallTree._containers``, ``phases``). An autograd node called by another one (the
function ``CopySlices`` wraps) is part of it, as in the graph ``pace profile`` walks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pace.importer.et import (
    NO_SEQ,
    SCOPE_BACKWARD_FUNCTION,
    SCOPE_USER,
    EtNode,
    ExecutionTrace,
)
from pace.importer.timing import STEP_RE, Timed

ENGINE_PREFIX = "autograd::engine::evaluate_function: "
ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"
# Scopes whose ops are not part of the forward/backward window.
OPTIMIZER_PREFIXES: tuple[str, ...] = ("Optimizer.step#", "Optimizer.zero_grad#")
EXCLUDED_PREFIXES: tuple[str, ...] = (*OPTIMIZER_PREFIXES, "enumerate(DataLoader)#", "pace::")


@dataclass(frozen=True, slots=True)
class Step:
    """One training step of the trace, its nodes by phase (each list in start order)."""

    label: str
    forward: tuple[EtNode, ...]  # raw forward ops, in the order their own work ran
    forward_start_us: tuple[float, ...]  # when each one's own work started
    forward_own_us: tuple[float, ...]  # its own time, raw ops called inside it excluded
    backward: tuple[EtNode, ...]  # autograd nodes, AccumulateGrad excluded
    accumulate: tuple[EtNode, ...]  # AccumulateGrad nodes
    engine: tuple[EtNode, ...]  # every node inside the backward pass, for data flow
    optimizer: tuple[EtNode, ...]  # every node inside an Optimizer.step# scope
    forward_begin_us: float
    forward_end_us: float  # = when the backward pass starts
    backward_end_us: float
    optimizer_us: float
    after_backward_ops: int  # ops after backward outside the optimizer (clipping, logging ...)


def is_backward_node(node: EtNode, parent: EtNode | None) -> bool:
    if node.scope == SCOPE_BACKWARD_FUNCTION:
        return True
    return parent is not None and parent.name == ENGINE_PREFIX + node.name


def is_operator(node: EtNode) -> bool:
    """A call that does work (an aten op, a custom autograd function), not a scope."""
    return not (
        node.is_meta
        or node.scope in (SCOPE_USER, SCOPE_BACKWARD_FUNCTION)
        or node.name.startswith("autograd::engine::")
        or STEP_RE.match(node.name) is not None
    )


def et_steps(et: ExecutionTrace) -> list[tuple[str, list[EtNode]]]:
    """(label, nodes) of every step of the execution trace (module docstring)."""
    marks = [n for n in et.nodes if STEP_RE.match(n.name)]
    nodes = [n for n in et.nodes if not n.is_meta]
    if not marks:
        return [("the execution trace", nodes)]
    out = []
    for k, mark in enumerate(marks):
        hi = marks[k + 1].id if k + 1 < len(marks) else None
        out.append((mark.name, [n for n in nodes if n.id >= mark.id and (hi is None or n.id < hi)]))
    return out


class CallTree:
    """Per-node facts derived from the call tree once."""

    def __init__(self, et: ExecutionTrace) -> None:
        by_id = et.by_id()
        self.by_id = by_id
        self.excluded: dict[int, bool] = {}
        self.in_optimizer: dict[int, bool] = {}
        self.in_engine: dict[int, bool] = {}
        self.backward: dict[int, bool] = {}
        self.under_node: dict[int, bool] = {}
        order = et.parents_first()
        for n in order:
            parent = by_id.get(n.parent) if n.parent != n.id else None
            p_excl = self.excluded.get(parent.id, False) if parent is not None else False
            p_eng = self.in_engine.get(parent.id, False) if parent is not None else False
            self.excluded[n.id] = p_excl or n.name.startswith(EXCLUDED_PREFIXES)
            p_opt = self.in_optimizer.get(parent.id, False) if parent is not None else False
            self.in_optimizer[n.id] = p_opt or n.name.startswith("Optimizer.step#")
            # A node called by another one (the function CopySlices wraps) is part of it, as
            # in the autograd graph pace profile walks.
            p_node = parent is not None and (
                self.backward.get(parent.id, False) or self.under_node.get(parent.id, False)
            )
            self.under_node[n.id] = p_node
            self.backward[n.id] = is_backward_node(n, parent) and not p_node
            self.in_engine[n.id] = p_eng or self.backward[n.id] or n.name.startswith(ENGINE_PREFIX)
        container = self._containers(order)
        # raw_owner[n]: the nearest raw op at or above n. A raw op is an operator that is no
        # container, and either outside every raw op or called through autograd itself (the
        # ``clone`` an in-place op's autograd kernel makes of its input before writing it).
        self.raw_owner: dict[int, int | None] = {}
        for n in order:
            parent = self.parent(n)
            above = self.raw_owner.get(parent.id) if parent is not None else None
            raw = is_operator(n) and n.id not in container and (above is None or n.seq != NO_SEQ)
            self.raw_owner[n.id] = n.id if raw else above

    def _containers(self, order: Sequence[EtNode]) -> set[int]:
        """Operators whose work is all in sequenced calls below them (module docstring).

        A composite op records the sequence number its first autograd call then takes, so it has
        a descendant with its own number (``linear`` and its ``t``); an op that made its own
        autograd node has none, even when its autograd kernel calls sequenced ops first. An op
        without a number (no grad mode) is a container when anything below it has one.
        """
        seq_below: dict[int, set[int]] = {}
        for n in reversed(order):  # children before parents
            if n.parent == n.id or n.parent not in self.by_id:
                continue
            mine = seq_below.get(n.id, set())
            if n.seq != NO_SEQ and is_operator(n):
                mine = mine | {n.seq}
            if mine:
                seq_below.setdefault(n.parent, set()).update(mine)
        return {
            n.id
            for n in order
            if is_operator(n)
            and (n.seq in seq_below.get(n.id, ()) if n.seq != NO_SEQ else bool(seq_below.get(n.id)))
        }

    def parent(self, node: EtNode) -> EtNode | None:
        return self.by_id.get(node.parent) if node.parent != node.id else None

    def outer_raw(self, node: EtNode) -> int | None:
        """The raw op ``node`` (a raw op) was called inside, if any."""
        parent = self.parent(node)
        return self.raw_owner.get(parent.id) if parent is not None else None


def phases(label: str, members: Sequence[EtNode], ctx: CallTree, timed: Timed) -> Step | None:
    """``members`` of one step by phase, timed by ``timed``; None without a backward pass."""

    def start(n: EtNode) -> float:
        return timed.start_us[n.id]

    members = [n for n in members if n.id in timed.start_us]
    engine = [n for n in members if ctx.in_engine[n.id] and not ctx.excluded[n.id]]
    nodes = [n for n in engine if ctx.backward[n.id]]
    if not nodes:
        return None
    backward = [n for n in nodes if n.name != ACCUMULATE_GRAD]
    accumulate = [n for n in nodes if n.name == ACCUMULATE_GRAD]
    bw_begin = min(start(n) for n in engine)
    bw_end = max(timed.end_us[n.id] for n in engine)

    forward: list[EtNode] = []
    after = 0
    for n in members:
        if ctx.in_engine[n.id] or ctx.excluded[n.id] or ctx.raw_owner[n.id] != n.id:
            continue
        if start(n) < bw_begin:
            forward.append(n)
        elif start(n) > bw_end:
            after += 1
    # A raw op's own work comes after the raw ops called inside it (the in-place op after the
    # clone of its input): it starts when they end, and its own time excludes theirs.
    first_us = {n.id: start(n) for n in forward}
    own_us = {n.id: timed.end_us[n.id] - start(n) for n in forward}
    for n in forward:
        outer = ctx.outer_raw(n)
        if outer is not None and outer in own_us:
            first_us[outer] = max(first_us[outer], timed.end_us[n.id])
            own_us[outer] -= timed.end_us[n.id] - start(n)
    forward.sort(key=lambda n: (first_us[n.id], n.id))
    # loss.backward() first makes the gradient seed; pace profile counts it in the backward pass.
    if forward and forward[-1].name == "aten::ones_like" and forward[-1].seq == NO_SEQ:
        bw_begin = first_us[forward.pop().id]
    if not forward:
        return None
    optimizer_us = sum(
        timed.end_us[n.id] - start(n)
        for n in members
        if n.name.startswith("Optimizer.step#") and not ctx.excluded.get(n.parent, False)
    )
    key = lambda n: (start(n), n.id)  # noqa: E731 - a sort key, named for the three sorts
    return Step(
        label=label,
        forward=tuple(forward),
        backward=tuple(sorted(backward, key=key)),
        accumulate=tuple(sorted(accumulate, key=key)),
        engine=tuple(sorted(engine, key=key)),
        optimizer=tuple(sorted((n for n in members if ctx.in_optimizer[n.id]), key=key)),
        forward_start_us=tuple(first_us[n.id] for n in forward),
        forward_own_us=tuple(max(own_us[n.id], 0.0) for n in forward),
        forward_begin_us=min(first_us[n.id] for n in forward),
        forward_end_us=bw_begin,
        backward_end_us=bw_end,
        optimizer_us=optimizer_us,
        after_backward_ops=after,
    )
