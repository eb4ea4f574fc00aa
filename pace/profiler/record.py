"""Record one eager training iteration: every forward aten op and every backward autograd node.

Forward: a ``TorchDispatchMode`` sees each aten op below autograd (composite ops already
decomposed), with the very tensor objects the model holds, so a weak map tensor -> producing op
gives the data dependencies, and identity with the model's ``Parameter`` objects tells which
parameters an op consumes. Views of a parameter (``t``, ``view``, ``expand`` ...) inherit the
parameter, so ``addmm(bias, x, t(weight))`` consumes both ``weight`` and ``bias``. In-place and
``out=`` ops make the writer the new producer of the tensor they write.

Backward: the autograd graph is walked from ``loss.grad_fn`` through ``next_functions``; every
node but ``AccumulateGrad`` gets a pre-hook and a post-hook (re-registered every iteration: each
iteration builds a new graph) stamping its start and end. ``AccumulateGrad.variable`` maps the
graph's leaves to parameters, and ``register_post_accumulate_grad_hook`` tells the moment each
gradient is ready: its producer is the last node that finished before that moment. Backward nodes
are linked to the forward op that created them by the autograd sequence number.

Everything here is per iteration and structural; folding, medians and the window are built by
``pace.profiler.window``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from pace.errors import InputError
from pace.profiler.clock import Clock

_WeakMap: Any
try:  # private but stable since torch 2.0; a plain dict keyed by id is the (leakier) fallback
    from torch.utils.weak import WeakIdKeyDictionary as _WeakMap
except ImportError:  # pragma: no cover - depends on the torch build
    _WeakMap = None

# Ops that move no data (aliases, metadata) or only allocate: zero cost, folded into neighbours.
ZERO_COST_FORWARD: frozenset[str] = frozenset(
    {
        "view",
        "_unsafe_view",
        "_reshape_alias",
        "t",
        "detach",
        "alias",
        "expand",
        "permute",
        "transpose",
        "unsqueeze",
        "squeeze",
        "as_strided",
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "lift_fresh",
        "split",
        "split_with_sizes",
        "unbind",
        "chunk",
        "slice",
        "select",
        "narrow",
        "diagonal",
        "unfold",
        "resize_",
        "_local_scalar_dense",
    }
)

# Backward nodes of the ops above whose gradient is again only a view (no data moved).
ZERO_COST_BACKWARD: frozenset[str] = frozenset(
    {
        "TBackward0",
        "ViewBackward0",
        "UnsafeViewBackward0",
        "ReshapeAliasBackward0",
        "PermuteBackward0",
        "TransposeBackward0",
        "TransposeBackward1",
        "UnsqueezeBackward0",
        "UnsqueezeBackward1",
        "SqueezeBackward0",
        "SqueezeBackward1",
        "SqueezeBackward2",
        "SqueezeBackward3",
        "SqueezeBackward4",
        "AliasBackward0",
        "DetachBackward0",
        "CloneBackward0",
    }
)


def _op_base_name(func: Any) -> str:
    try:
        return str(func.overloadpacket.__name__)
    except AttributeError:  # not an OpOverload (should not happen below autograd)
        return str(getattr(func, "__name__", func))


def _is_alias_op(func: Any, base: str) -> bool:
    """Outputs alias the input: a view of a parameter still *is* the parameter."""
    try:
        if bool(func.is_view):
            return True
    except AttributeError:
        pass
    return base in {"_unsafe_view", "detach", "alias", "lift_fresh"}


@dataclass(frozen=True, slots=True)
class _FuncInfo:
    base: str
    alias: bool
    written: tuple[tuple[int, str], ...]  # (position, name) of arguments the op writes


# Per-op facts read from the schema once: the recorder's bookkeeping runs for every op call,
# and less of it means less perturbation of the timings.
_FUNC_INFO: dict[Any, _FuncInfo] = {}


def _func_info(func: Any) -> _FuncInfo:
    info = _FUNC_INFO.get(func)
    if info is None:
        base = _op_base_name(func)
        try:
            schema_args = func._schema.arguments
        except AttributeError:
            schema_args = []
        written = tuple(
            (pos, str(arg.name))
            for pos, arg in enumerate(schema_args)
            if arg.alias_info is not None and arg.alias_info.is_write
        )
        info = _FuncInfo(base=base, alias=_is_alias_op(func, base), written=written)
        _FUNC_INFO[func] = info
    return info


def _written_args(
    info: _FuncInfo, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[torch.Tensor]:
    """Tensor arguments the op writes (in-place ``self``, ``out=``), from its schema."""
    written: list[torch.Tensor] = []
    for pos, name in info.written:
        value = args[pos] if pos < len(args) else kwargs.get(name)
        written.extend(v for v in tree_leaves(value) if isinstance(v, torch.Tensor))
    return written


@dataclass(kw_only=True, slots=True)
class FwOp:
    """One forward aten op as recorded (raw: before folding)."""

    kind: str  # e.g. "addmm"
    module: str  # qualified name of the innermost module running, "" if none
    deps: tuple[int, ...]  # raw indices of the ops that produced its tensor inputs
    params: tuple[str, ...]  # parameters it consumes (directly or through views)
    fold: bool  # zero-cost or buffer-only: folded into neighbours, not an op of the trace
    start: Any = None  # clock marks, resolved to ns by the recorder after the iteration
    end: Any = None
    book_after_ns: float = 0.0  # host time spent in our own bookkeeping after this op's kernel

    def signature(self) -> tuple[object, ...]:
        return (self.kind, self.module, self.deps, self.params, self.fold)


@dataclass(kw_only=True, slots=True)
class BwNode:
    """One executed backward autograd node (raw: before folding), in execution order."""

    kind: str  # node.name(), e.g. "ConvolutionBackward0"
    seq_nr: int  # autograd sequence number, -1 if unavailable
    parents: tuple[int, ...]  # execution indices of nodes that feed it a gradient
    fold: bool
    start: Any = None
    end: Any = None

    def signature(self) -> tuple[object, ...]:
        return (self.kind, self.parents, self.fold)


@dataclass(kw_only=True, slots=True)
class IterationRecord:
    """One training iteration: forward ops, backward nodes, gradient-ready points, wall times.

    Times are in ns relative to the start of the iteration's forward pass, on the recorder's clock.
    """

    fw: list[FwOp] = field(default_factory=list)
    fw_start_ns: list[float] = field(default_factory=list)
    fw_end_ns: list[float] = field(default_factory=list)
    fw_seq: dict[int, int] = field(default_factory=dict)  # autograd seq nr -> raw fw index
    bw: list[BwNode] = field(default_factory=list)
    bw_start_ns: list[float] = field(default_factory=list)
    bw_end_ns: list[float] = field(default_factory=list)
    grad_ready: dict[str, int] = field(default_factory=dict)  # param -> bw exec index
    grad_parents: dict[str, tuple[int, ...]] = field(default_factory=dict)  # graph fallback
    forward_end_ns: float = 0.0  # when step_fn returned
    backward_start_ns: float = 0.0
    backward_end_ns: float = 0.0
    optimizer_ns: float = 0.0

    def signature(self) -> tuple[object, ...]:
        return (
            tuple(op.signature() for op in self.fw),
            tuple(n.signature() for n in self.bw),
            tuple(sorted(self.grad_ready.items())),
        )


class _ForwardMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records every aten op run while active (see module docstring)."""

    def __init__(
        self,
        *,
        clock: Clock,
        param_ids: Mapping[int, str],
        buffer_ids: frozenset[int],
        module_stack: list[str],
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.clock = clock
        self.ops: list[FwOp] = []
        self.seq: dict[int, int] = {}
        self._param_ids = param_ids
        self._buffer_ids = buffer_ids
        self._module_stack = module_stack
        self._producer: Any = _WeakMap() if _WeakMap is not None else {}
        self._alias_params: Any = _WeakMap() if _WeakMap is not None else {}
        self._pending: tuple[int, list[torch.Tensor]] | None = None
        self._book_ns = 0.0

    def _key(self, t: torch.Tensor) -> Any:
        return t if _WeakMap is not None else id(t)

    def flush(self) -> None:
        """Link the previous op to its autograd node: autograd sets ``grad_fn`` after we return."""
        if self._pending is None:
            return
        index, outs = self._pending
        self._pending = None
        for t in outs:
            node = t.grad_fn
            if node is None:
                continue
            try:
                self.seq.setdefault(int(node._sequence_nr()), index)
            except (AttributeError, RuntimeError):  # private API: linking is best effort
                return

    def finish(self) -> None:
        t0 = time.perf_counter_ns()
        self.flush()
        if self.ops:
            self.ops[-1].book_after_ns = self._book_ns + (time.perf_counter_ns() - t0)
        self._book_ns = 0.0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        t0 = time.perf_counter_ns()
        kwargs = kwargs or {}
        self.flush()
        finfo = _func_info(func)
        base = finfo.base
        deps: set[int] = set()
        params: list[str] = []
        inputs = [a for a in tree_leaves((args, dict(kwargs))) if isinstance(a, torch.Tensor)]
        only_buffers = bool(inputs)
        for t in inputs:
            pname = self._param_ids.get(id(t))
            if pname is not None:
                params.append(pname)
                only_buffers = False
                continue
            key = self._key(t)
            aliased = self._alias_params.get(key)
            if aliased:
                params.extend(aliased)
                only_buffers = False
                continue
            prod = self._producer.get(key)
            if prod is not None:
                deps.add(prod)
                only_buffers = False
            elif id(t) not in self._buffer_ids:
                only_buffers = False
        # BatchNorm's num_batches_tracked += 1 and the like: state bookkeeping off the data path.
        fold = base in ZERO_COST_FORWARD or (only_buffers and not params)
        index = len(self.ops)
        op = FwOp(
            kind=base,
            module=self._module_stack[-1] if self._module_stack else "",
            deps=tuple(sorted(deps)),
            params=tuple(dict.fromkeys(params)),
            fold=fold,
        )
        if self.ops:
            self.ops[-1].book_after_ns = self._book_ns + (time.perf_counter_ns() - t0)
        self._book_ns = 0.0
        op.start = self.clock.mark()
        out = func(*args, **kwargs)
        op.end = self.clock.mark()
        t1 = time.perf_counter_ns()
        self.ops.append(op)
        outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
        for t in (*outs, *_written_args(finfo, args, kwargs)):
            self._producer[self._key(t)] = index
        if params and finfo.alias:
            for t in outs:
                self._alias_params[self._key(t)] = op.params
        self._pending = (index, outs)
        self._book_ns += time.perf_counter_ns() - t1
        return out


@contextmanager
def _module_tracking(names: Mapping[int, str], stack: list[str]) -> Iterator[None]:
    """Keep ``stack`` = qualified names of the modules whose forward is running."""
    from torch.nn.modules import module as nn_module

    def pre(mod: torch.nn.Module, _inp: Any) -> None:
        stack.append(names.get(id(mod), stack[-1] if stack else ""))

    def post(_mod: torch.nn.Module, _inp: Any, _out: Any) -> None:
        if stack:
            stack.pop()

    try:
        h_pre = nn_module.register_module_forward_pre_hook(pre)
        h_post = nn_module.register_module_forward_hook(post)
    except AttributeError:  # pragma: no cover - very old torch: ops just carry no module name
        yield
        return
    try:
        yield
    finally:
        h_pre.remove()
        h_post.remove()


class _BackwardHooks:
    """Per-iteration backward instrumentation (hooks live on this iteration's graph only)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.order: list[int] = []  # node ids in execution order
        self.start: dict[int, Any] = {}
        self.end: dict[int, Any] = {}
        self.last_finished: int | None = None
        self.grad_ready: dict[str, int] = {}  # param -> node id

    def on_grad(self, name: str) -> None:
        if self.last_finished is not None:
            self.grad_ready[name] = self.last_finished


def _walk_graph(
    root: Any, param_ids: Mapping[int, str]
) -> tuple[dict[int, Any], dict[int, list[int]], dict[str, list[int]]]:
    """Nodes by id, parents of each node, and the nodes feeding each parameter's AccumulateGrad."""
    nodes: dict[int, Any] = {}
    parents: dict[int, list[int]] = {}
    feeds: dict[str, list[int]] = {}
    stack = [root]
    nodes[id(root)] = root
    while stack:
        node = stack.pop()
        for child, _ in node.next_functions:
            if child is None:
                continue
            variable = getattr(child, "variable", None)
            if variable is not None:  # AccumulateGrad: a leaf; not an op of the trace
                pname = param_ids.get(id(variable))
                if pname is not None:
                    feeds.setdefault(pname, []).append(id(node))
                continue
            parents.setdefault(id(child), []).append(id(node))
            if id(child) not in nodes:
                nodes[id(child)] = child
                stack.append(child)
    return nodes, parents, feeds


class Recorder:
    """Records iterations of one model; create once, call ``iteration`` repeatedly."""

    def __init__(
        self, model: torch.nn.Module, clock: Clock, *, accumulate_hook: bool | None = None
    ) -> None:
        self.model = model
        self.clock = clock
        self.params: dict[str, torch.nn.Parameter] = dict(model.named_parameters())
        self.param_ids: dict[int, str] = {id(p): n for n, p in self.params.items()}
        self.buffer_ids = frozenset(id(b) for b in model.buffers())
        self.module_names: dict[int, str] = {id(m): n for n, m in model.named_modules() if n}
        self._hooks: _BackwardHooks | None = None
        self._handles: list[Any] = []
        # torch < 2.1 lacks the hook; ``accumulate_hook=False`` forces the graph fallback (tests).
        available = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
        self.has_accumulate_hook = (
            available if accumulate_hook is None else (accumulate_hook and available)
        )

    def __enter__(self) -> Recorder:
        if self.has_accumulate_hook:
            for name, p in self.params.items():
                if p.requires_grad:
                    self._handles.append(
                        p.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                            self._grad_hook(name)
                        )
                    )
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _grad_hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def hook(_p: torch.Tensor) -> None:
            if self._hooks is not None:
                self._hooks.on_grad(name)

        return hook

    def iteration(
        self,
        forward: Callable[[], torch.Tensor],
        optimizer_step: Callable[[], None] | None,
    ) -> IterationRecord:
        """Run and record one iteration: ``forward()`` returns the loss; backward is run here."""
        clock = self.clock
        stack: list[str] = []
        mode = _ForwardMode(
            clock=clock, param_ids=self.param_ids, buffer_ids=self.buffer_ids, module_stack=stack
        )
        t_begin = clock.mark()
        with _module_tracking(self.module_names, stack), mode:
            loss = forward()
            mode.finish()
        t_fw_end = clock.mark()
        root = loss.grad_fn
        if root is None:
            raise InputError(
                "the loss does not require grad (no autograd graph to profile)", field="loss"
            )
        nodes, parents, feeds = _walk_graph(root, self.param_ids)
        hooks = _BackwardHooks(clock)
        for nid, node in nodes.items():
            node.register_prehook(self._pre(hooks, nid))
            node.register_hook(self._post(hooks, nid))
        self._hooks = hooks
        t_bw_start = clock.mark()
        try:
            loss.backward()  # type: ignore[no-untyped-call]
        finally:
            self._hooks = None
        t_bw_end = clock.mark()
        # The optimizer is stamped on the same clock: on a GPU its kernels run after step()
        # returns, so a host timer would measure only their launches.
        t_opt_start = t_opt_end = t_bw_end
        if optimizer_step is not None:
            t_opt_start = clock.mark()
            optimizer_step()
            t_opt_end = clock.mark()

        # Resolve all stamps in one go (one device synchronisation on CUDA).
        fw_marks: list[Any] = []
        for op in mode.ops:
            fw_marks += [op.start, op.end]
        bw_marks: list[Any] = []
        for nid in hooks.order:
            bw_marks += [hooks.start[nid], hooks.end.get(nid, hooks.start[nid])]
        ns = clock.resolve(
            [t_begin, t_fw_end, t_bw_start, t_bw_end, t_opt_start, t_opt_end, *fw_marks, *bw_marks]
        )
        rec = IterationRecord(
            fw=mode.ops,
            fw_seq=mode.seq,
            forward_end_ns=ns[1],
            backward_start_ns=ns[2],
            backward_end_ns=ns[3],
            optimizer_ns=max(ns[5] - ns[4], 0.0),
        )
        k = 6
        rec.fw_start_ns = ns[k : k + len(fw_marks) : 2]
        rec.fw_end_ns = ns[k + 1 : k + len(fw_marks) : 2]
        k += len(fw_marks)
        rec.bw_start_ns = ns[k : k + len(bw_marks) : 2]
        rec.bw_end_ns = ns[k + 1 : k + len(bw_marks) : 2]
        exec_index = {nid: i for i, nid in enumerate(hooks.order)}
        for nid in hooks.order:
            node = nodes[nid]
            kind = str(node.name())
            try:
                seq_nr = int(node._sequence_nr())
            except (AttributeError, RuntimeError):
                seq_nr = -1
            rec.bw.append(
                BwNode(
                    kind=kind,
                    seq_nr=seq_nr,
                    parents=tuple(
                        sorted({exec_index[p] for p in parents.get(nid, []) if p in exec_index})
                    ),
                    fold=kind in ZERO_COST_BACKWARD,
                )
            )
        rec.grad_ready = {n: exec_index[i] for n, i in hooks.grad_ready.items() if i in exec_index}
        rec.grad_parents = {
            n: tuple(sorted(exec_index[i] for i in ids if i in exec_index))
            for n, ids in feeds.items()
        }
        return rec

    @staticmethod
    def _pre(hooks: _BackwardHooks, nid: int) -> Callable[..., None]:
        def pre(_grad_outputs: Any) -> None:
            hooks.order.append(nid)
            hooks.start[nid] = hooks.clock.mark()

        return pre

    @staticmethod
    def _post(hooks: _BackwardHooks, nid: int) -> Callable[..., None]:
        def post(_grad_inputs: Any, _grad_outputs: Any) -> None:
            hooks.end[nid] = hooks.clock.mark()
            hooks.last_finished = nid

        return post
