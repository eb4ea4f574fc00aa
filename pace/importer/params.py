"""Parameter names: from the trace's markers, else from a ``named_parameters()`` file, else none.

Neither a Kineto trace nor an execution trace names parameters: an execution trace knows a
parameter only as a storage id read by forward ops. Names come, in this order, from:

1. **Markers in the trace.** ``pace.importer.record`` runs, inside the profiled step and before
   the step function, a ``pace::parameters`` scope with one ``pace::parameter::NAME`` scope per
   trainable parameter (and ``pace::buffer::NAME`` per buffer), each holding one ``aten::alias``
   of that tensor: the execution trace then records which storage id is which name. Exact.
2. **A parameters file** (``pace.importer.save_parameters(model, path)``: names, shapes and
   element sizes of ``named_parameters()``, in order). The trace's parameters are matched to it
   by shape and element size, in the order the optimizer step touches them (``torch.optim``
   walks its ``param_groups``, which is ``model.parameters()`` order when the optimizer was
   built from it) or, without an optimizer step in the trace, in the order the forward pass
   first reads them. Exact when every shape is unique; parameters of one shape can swap names
   when the model reads them in another order than it registers them (``meta.import.warnings``
   says how many names were matched this way).
3. **Neither:** names ``param0``, ``param1``, ... in that same order, with a warning. The
   trace compiles, but a schedule made from it does not match the model at run time (the
   runtime refuses it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pace.errors import InputError
from pace.importer.et import ExecutionTrace, TensorRef
from pace.importer.files import PathLike, read_json_object

PARAMETERS_FORMAT = "pace.parameters"
PARAMETERS_VERSION = 1
MARKER_SCOPE = "pace::parameters"
PARAMETER_PREFIX = "pace::parameter::"
BUFFER_PREFIX = "pace::buffer::"


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One entry of a parameters file."""

    name: str
    shape: tuple[int, ...]
    element_bytes: int
    requires_grad: bool = True

    @property
    def size_bytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.element_bytes


def parameters_document(
    params: Sequence[ParamSpec], buffers: Sequence[str] = (), model: str = ""
) -> dict[str, Any]:
    """The JSON object of a parameters file (``load_parameters`` reads it back)."""
    return {
        "format": PARAMETERS_FORMAT,
        "version": PARAMETERS_VERSION,
        "model": model,
        "parameters": [
            {
                "name": p.name,
                "shape": list(p.shape),
                "element_bytes": p.element_bytes,
                "requires_grad": p.requires_grad,
            }
            for p in params
        ],
        "buffers": list(buffers),
    }


def load_parameters(path: PathLike) -> list[ParamSpec]:
    """The parameters of a file written by ``save_parameters``; ``InputError`` if malformed."""
    where = str(path)
    obj = read_json_object(path, "parameters file")
    if obj.get("format") != PARAMETERS_FORMAT:
        raise InputError(
            f"expected {PARAMETERS_FORMAT!r} (written by pace.importer.save_parameters), got "
            f"{json.dumps(obj.get('format'))}",
            where=where,
            field="format",
        )
    if obj.get("version") != PARAMETERS_VERSION:
        raise InputError(
            f"unsupported version {json.dumps(obj.get('version'))} (supported: "
            f"{PARAMETERS_VERSION})",
            where=where,
            field="version",
        )
    raw = obj.get("parameters")
    if not isinstance(raw, list):
        raise InputError("must be a list", where=where, field="parameters")
    out: list[ParamSpec] = []
    names: set[str] = set()
    for i, p in enumerate(raw):
        path_i = f"parameters[{i}]"
        if not isinstance(p, dict):
            raise InputError("must be an object", where=where, field=path_i)
        name, shape = p.get("name"), p.get("shape")
        elem, grad = p.get("element_bytes"), p.get("requires_grad", True)
        if not isinstance(name, str) or not name:
            raise InputError("must be a non-empty string", where=where, field=f"{path_i}.name")
        if name in names:
            raise InputError(f"name {name!r} repeated", where=where, field=f"{path_i}.name")
        names.add(name)
        if not isinstance(shape, list) or not all(_nonneg_int(d) for d in shape):
            raise InputError(
                f"must be a list of integers >= 0, got {shape!r}",
                where=where,
                field=f"{path_i}.shape",
            )
        if not isinstance(elem, int) or isinstance(elem, bool) or elem < 1:
            raise InputError(
                f"must be an integer >= 1, got {elem!r}",
                where=where,
                field=f"{path_i}.element_bytes",
            )
        if not isinstance(grad, bool):
            raise InputError(
                f"must be true or false, got {grad!r}", where=where, field=f"{path_i}.requires_grad"
            )
        out.append(ParamSpec(name=name, shape=tuple(shape), element_bytes=elem, requires_grad=grad))
    return out


def _nonneg_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


@dataclass(frozen=True, slots=True)
class Markers:
    """What the recording helper's markers say: parameter and buffer storages by name."""

    parameters: tuple[tuple[str, TensorRef], ...]  # in named_parameters() order
    buffers: Mapping[int, str]  # storage id -> buffer name


def find_markers(et: ExecutionTrace) -> Markers | None:
    """The markers of the first step that has them, or None (module docstring)."""
    children = et.children
    by_id = et.by_id()
    params: dict[str, TensorRef] = {}
    buffers: dict[int, str] = {}
    for n in et.nodes:
        for prefix, is_param in ((PARAMETER_PREFIX, True), (BUFFER_PREFIX, False)):
            if not n.name.startswith(prefix):
                continue
            name = n.name[len(prefix) :]
            tensors = [t for c in children.get(n.id, ()) for t in by_id[c].inputs]
            if not tensors:
                continue
            if is_param:
                params.setdefault(name, tensors[0])
            else:
                buffers.setdefault(tensors[0].storage_id, name)
    if not params:
        return None
    return Markers(parameters=tuple(params.items()), buffers=buffers)


@dataclass(frozen=True, slots=True)
class Naming:
    """Names of the parameters found in the trace (by storage id) and their order."""

    names: Mapping[int, str]
    order: tuple[int, ...]  # storage ids, the order of ParamInfo (ties in the trace)
    source: str  # "trace markers", "parameters file", "none"
    without_grad: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)


def name_from_markers(markers: Markers, found: Mapping[int, TensorRef]) -> Naming:
    """``found`` holds marked storages only (``pace.importer.link`` is told which they are)."""
    names = {t.storage_id: name for name, t in markers.parameters}
    return Naming(
        names=names,
        order=tuple(t.storage_id for _, t in markers.parameters if t.storage_id in found),
        source="trace markers",
        without_grad=tuple(name for name, t in markers.parameters if t.storage_id not in found),
    )


def name_from_file(
    specs: Sequence[ParamSpec],
    found: Mapping[int, TensorRef],
    order: Sequence[int],
    *,
    where: str,
    order_source: str,
) -> Naming:
    """Match the trace's parameters (``found``, ranked by ``order``) to ``specs`` by shape."""
    by_kind: dict[tuple[tuple[int, ...], int], list[ParamSpec]] = {}
    for spec in specs:
        if spec.requires_grad:
            by_kind.setdefault((spec.shape, spec.element_bytes), []).append(spec)
    names: dict[int, str] = {}
    for storage in order:
        t = found[storage]
        kind = (t.shape, t.itemsize)
        pool = by_kind.get(kind)
        if not pool:
            raise InputError(
                f"the trace has a gradient of shape {list(t.shape)} ({t.itemsize}-byte elements) "
                "that no trainable parameter listed here has: the file describes another model",
                where=where,
                field="parameters",
            )
        names[storage] = pool.pop(0).name
    # Names that shape alone does not decide.
    shared = sum(1 for s in order if _kind_count(specs, found[s]) > 1)
    used = set(names.values())
    without = tuple(s.name for s in specs if s.requires_grad and s.name not in used)
    warnings = []
    if shared:
        warnings.append(
            f"{shared} parameter names matched by shape and {order_source} order among "
            "parameters of the same shape (docs/import.md)"
        )
    if without:
        warnings.append(f"{len(without)} listed parameter(s) got no gradient")
    rank = {s: k for k, s in enumerate(order)}
    spec_rank = {s.name: k for k, s in enumerate(specs)}
    final = tuple(sorted(order, key=lambda s: (spec_rank[names[s]], rank[s])))
    return Naming(
        names=names,
        order=final,
        source="parameters file",
        without_grad=without,
        warnings=tuple(warnings),
    )


def _kind_count(specs: Sequence[ParamSpec], t: TensorRef) -> int:
    kind = (t.shape, t.itemsize)
    return sum(1 for s in specs if s.requires_grad and (s.shape, s.element_bytes) == kind)


def name_anonymously(order: Sequence[int], order_source: str) -> Naming:
    return Naming(
        names={s: f"param{k}" for k, s in enumerate(order)},
        order=tuple(order),
        source="none",
        warnings=(
            "no parameter names (no pace::parameter markers in the trace, no --parameters "
            f"file): named param0, param1, ... in {order_source} order; a schedule compiled "
            "from this trace will not match the model at run time",
        ),
    )
