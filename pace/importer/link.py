"""Data flow of one step from the execution trace's tensor ids, and which gradient is which.

**Forward.** An op depends on the op that last output a tensor id it reads (in-place ops list the
tensor they write among their outputs, so the writer becomes its producer, as in ``pace
profile``). A tensor read before any op of the step wrote it is a *leaf*: a parameter, a buffer or
an input.

**Backward.** An autograd node's inputs are the gradients fed to it. An op inside a node's
record-function scope is produced by that node. The engine runs more ops inside the node's
``evaluate_function`` scope but after the node's own scope ends: shape checks (``sum_to`` of a
broadcast bias gradient) and the sums of gradients arriving from several nodes. Their outputs
are produced by the node *and* by the producers of their inputs, so a node's parents are its
graph parents plus some of their ancestors: the same reachability as ``pace profile``'s graph.

**Gradients.** An ``AccumulateGrad`` node does not name its parameter. It is linked through the
autograd sequence number: the nodes that produced its gradient were created by forward ops with
their ``seq_id``; the parameter is the input of those ops whose shape and element size are the
gradient's. Several candidates of one shape (a batch norm's weight and bias) come from the same
node, so they share a producer and a consumer: which name goes to which changes nothing in the
trace, and they are taken in parameter order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pace.importer.et import NO_SEQ, EtNode, TensorRef
from pace.importer.steps import ACCUMULATE_GRAD, ENGINE_PREFIX, Step
from pace.importer.timing import Timed


@dataclass(frozen=True, slots=True)
class ForwardFlow:
    deps: tuple[tuple[int, ...], ...]  # per raw forward op: raw ops it reads from
    leaves: Mapping[tuple[int, int], TensorRef]  # TensorRef.key -> read before any op wrote it
    first_use: Mapping[int, int]  # storage id of a leaf -> first raw op reading it
    inplace_on_leaves: tuple[bool, ...]  # per op: reads only leaves and writes one in place


@dataclass(frozen=True, slots=True)
class BackwardFlow:
    parents: tuple[tuple[int, ...], ...]  # per raw backward node, raw indices (all smaller)
    grad_producers: tuple[frozenset[int], ...]  # per AccumulateGrad
    ready: tuple[int | None, ...]  # per AccumulateGrad: last raw node finished before it


def forward_flow(step: Step) -> ForwardFlow:
    producer: dict[tuple[int, int], int] = {}
    leaves: dict[tuple[int, int], TensorRef] = {}
    first_use: dict[int, int] = {}
    deps: list[tuple[int, ...]] = []
    inplace: list[bool] = []
    for i, op in enumerate(step.forward):
        mine: set[int] = set()
        all_leaves = bool(op.inputs)
        for t in op.inputs:
            p = producer.get(t.key)
            if p is None:
                leaves.setdefault(t.key, t)
                first_use.setdefault(t.storage_id, i)
            else:
                mine.add(p)
                all_leaves = False
        in_keys = {t.key for t in op.inputs}
        inplace.append(all_leaves and any(t.key in in_keys for t in op.outputs))
        deps.append(tuple(sorted(mine)))
        for t in op.outputs:
            producer[t.key] = i
    return ForwardFlow(
        deps=tuple(deps), leaves=leaves, first_use=first_use, inplace_on_leaves=tuple(inplace)
    )


def backward_flow(step: Step, timed: Timed, parent_of: Mapping[int, int]) -> BackwardFlow:
    """``parent_of``: node id -> enclosing node id (the call tree)."""
    raw_index = {n.id: k for k, n in enumerate(step.backward)}
    accumulate_ids = {n.id for n in step.accumulate}
    engine_ids = {n.id for n in step.engine}
    by_id = {n.id: n for n in step.engine}
    kids: dict[int, list[EtNode]] = {}
    for n in step.engine:
        kids.setdefault(n.parent, []).append(n)
    owner_cache: dict[int, tuple[int | None, bool]] = {}

    def owner(node_id: int) -> tuple[int | None, bool]:
        """(raw node that produces this op's outputs, whether the op is inside its scope)."""
        if node_id in owner_cache:
            return owner_cache[node_id]
        result: tuple[int | None, bool] = (None, False)
        cur = node_id
        seen: set[int] = set()  # a damaged file's ctrl_deps may loop
        while cur in engine_ids and cur not in seen:
            seen.add(cur)
            node = by_id[cur]
            if cur in raw_index:
                result = (raw_index[cur], True)
                break
            if cur in accumulate_ids:
                break  # writing .grad: nobody in the backward pass reads it
            if node.name.startswith(ENGINE_PREFIX):
                inner = node.name[len(ENGINE_PREFIX) :]
                node_kids = [k for k in kids.get(cur, ()) if k.name == inner]
                if node_kids and node_kids[0].id in raw_index:
                    result = (raw_index[node_kids[0].id], False)
                break
            nxt = parent_of.get(cur)
            if nxt is None or nxt == cur:
                break
            cur = nxt
        owner_cache[node_id] = result
        return result

    producers: dict[tuple[int, int], frozenset[int]] = {}
    parents: list[tuple[int, ...]] = [() for _ in step.backward]
    grads: list[frozenset[int]] = []
    for node in step.engine:  # start order
        fed: set[int] = set()
        for t in node.inputs:
            fed |= producers.get(t.key, frozenset())
        if node.id in raw_index:
            k = raw_index[node.id]
            parents[k] = tuple(sorted(p for p in fed if p < k))
            if node.id not in kids:
                # Nothing ran inside: the node hands its input gradients on unchanged (an add's
                # AddBackward0), so whoever reads them next is fed by this node.
                for t in node.inputs:
                    producers[t.key] = frozenset({k})
            continue
        if node.id in accumulate_ids:
            grads.append(frozenset(fed))
            continue
        if node.name.startswith(ENGINE_PREFIX) or node.name == ACCUMULATE_GRAD:
            continue
        raw, inside = owner(node.id)
        if raw is None:
            made = frozenset(fed)
        elif inside:
            made = frozenset({raw})
        else:
            made = frozenset(fed | {raw})
        for t in node.outputs:
            producers[t.key] = made
    return BackwardFlow(
        parents=tuple(parents),
        grad_producers=tuple(grads),
        ready=_ready_points(step, timed),
    )


def _ready_points(step: Step, timed: Timed) -> tuple[int | None, ...]:
    """Per AccumulateGrad, the raw node that finished last before it started (``pace profile``:
    the gradient's producer is the last node whose post-hook ran before its ready hook)."""
    ends = sorted(
        ((timed.end_us[n.id], k) for k, n in enumerate(step.backward)), key=lambda e: (e[0], e[1])
    )
    out: list[int | None] = []
    pos = 0
    last: int | None = None
    for acc in step.accumulate:  # in start order, so one sweep suffices
        t = timed.start_us[acc.id]
        while pos < len(ends) and ends[pos][0] <= t:
            last = ends[pos][1]
            pos += 1
        out.append(last)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class GradientLinks:
    storage: tuple[int | None, ...]  # per AccumulateGrad: the parameter's storage id
    tensor: Mapping[int, TensorRef]  # storage id -> the parameter tensor
    ambiguous: int  # gradients with several candidates of their shape
    unlinked: int  # gradients linked by shape alone (no candidate through seq_id)


def link_gradients(
    step: Step,
    fw: ForwardFlow,
    bw: BackwardFlow,
    *,
    is_parameter: Callable[[TensorRef], bool],
    order: Mapping[int, int],
) -> GradientLinks:
    """Which parameter each ``AccumulateGrad`` of ``step`` accumulates into (module docstring).

    ``is_parameter`` says whether a forward input may be a parameter; ``order`` ranks parameter
    storages (lower first) to break ties.
    """
    # The op that created the node with sequence number s is the last op recording s.
    fw_by_seq: dict[int, EtNode] = {op.seq: op for op in step.forward if op.seq != NO_SEQ}
    params_seen: dict[int, TensorRef] = {}
    for t in fw.leaves.values():
        if is_parameter(t):
            params_seen.setdefault(t.storage_id, t)
    taken: set[int] = set()
    out: list[int | None] = []
    ambiguous = unlinked = 0
    rank = lambda s: (order.get(s, len(order)), s)  # noqa: E731 - a sort key
    for acc, producers in zip(step.accumulate, bw.grad_producers, strict=True):
        if not acc.inputs:
            out.append(None)
            continue
        grad = acc.inputs[0]
        candidates: set[int] = set()
        for p in producers:
            op = fw_by_seq.get(step.backward[p].seq)
            if op is None:
                continue
            candidates |= {
                t.storage_id
                for t in op.inputs
                if t.storage_id in params_seen and _same_kind(params_seen[t.storage_id], grad)
            }
        free = sorted(candidates - taken, key=rank)
        if not free:
            unlinked += 1
            free = sorted(
                (s for s, t in params_seen.items() if s not in taken and _same_kind(t, grad)),
                key=rank,
            )
        elif len(free) > 1:
            ambiguous += 1
        if not free:
            out.append(None)
            continue
        taken.add(free[0])
        out.append(free[0])
    return GradientLinks(
        storage=tuple(out), tensor=params_seen, ambiguous=ambiguous, unlinked=unlinked
    )


def _same_kind(param: TensorRef, grad: TensorRef) -> bool:
    return param.shape == grad.shape and param.itemsize == grad.itemsize


def optimizer_order(nodes: Sequence[EtNode], storages: set[int]) -> dict[int, int]:
    """Rank of each storage in ``storages`` by the first optimizer op that touches it."""
    order: dict[int, int] = {}
    for node in nodes:
        for t in node.inputs:
            if t.storage_id in storages and t.storage_id not in order:
                order[t.storage_id] = len(order)
    return order
