"""PyTorch Execution Trace (``torch.profiler.ExecutionTraceObserver``) -> typed nodes.

An execution trace is ``{"schema": ..., "nodes": [...]}`` with one node per recorded function
(operator, autograd node, ``record_function`` scope), written when the function ends. What the
importer uses of a node:

* ``id`` (assigned when the function starts, so ids are in start order across threads) and
  ``ctrl_deps``, the id of the enclosing node (the call tree; the root points to itself);
* ``name`` (``aten::addmm``, ``AddmmBackward0``, ``ProfilerStep#3`` ...);
* ``attrs``: ``rf_id`` (the record-function id, the key Kineto events carry as ``Record function
  id``), ``seq_id`` (the autograd sequence number linking a forward op to its backward node),
  ``scope`` (1 = an autograd node, 7 = a user ``record_function``), ``tid``;
* ``inputs`` / ``outputs``: ``{"values", "shapes", "types"}``, where a tensor value is
  ``[tensor_id, storage_id, offset, numel, itemsize, device]`` and a tensor list a list of them.

The ids in tensor values are what makes the data dependencies exact: an op depends on the op that
last output the tensor id it reads, and every view of a parameter shares its ``storage_id``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pace.errors import InputError
from pace.importer.files import PathLike, read_json_object

SCOPE_FUNCTION = 0
SCOPE_BACKWARD_FUNCTION = 1
SCOPE_USER = 7
NO_SEQ = -1
# The observer's own bookkeeping nodes (process and thread roots).
_META_PREFIX = "[pytorch|profiler|execution_trace|"
_TENSOR_VALUE_LEN = 6


@dataclass(frozen=True, slots=True)
class TensorRef:
    """One tensor argument of a node."""

    tensor_id: int
    storage_id: int
    numel: int
    itemsize: int
    shape: tuple[int, ...]
    dtype: str  # as the ET spells it: "float", "c10::Half", "long int" ...

    @property
    def size_bytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def key(self) -> tuple[int, int]:
        """Who this tensor is. The observer's ids follow addresses, which the allocator reuses
        once a tensor dies; a tensor made outside any recorded call (the 0-dim tensor wrapping
        the 1 of ``x.add_(1)``) can land on a dead tensor's ids. Both ids together rarely
        collide."""
        return (self.tensor_id, self.storage_id)


@dataclass(frozen=True, slots=True)
class EtNode:
    """One recorded function."""

    id: int
    name: str
    parent: int
    rf_id: int
    seq: int
    scope: int
    tid: int
    inputs: tuple[TensorRef, ...]
    outputs: tuple[TensorRef, ...]

    @property
    def is_meta(self) -> bool:
        return self.name.startswith(_META_PREFIX)


@dataclass(frozen=True, slots=True)
class ExecutionTrace:
    """The nodes of one execution trace, in start order, with the call tree."""

    path: str
    schema: str
    nodes: tuple[EtNode, ...]
    children: Mapping[int, tuple[int, ...]]  # node id -> child ids, in start order

    def by_id(self) -> dict[int, EtNode]:
        return {n.id: n for n in self.nodes}

    def parents_first(self) -> list[EtNode]:
        """Every node, each after its enclosing node. Ids alone do not give that: a node of
        another thread (gloo's) can be filed under a node that started after it. Nodes on a
        cycle of ``ctrl_deps`` (a damaged file) come last, in id order."""
        by_id = self.by_id()
        roots = [n for n in self.nodes if n.parent == n.id or n.parent not in by_id]
        out: list[EtNode] = []
        seen: set[int] = set()
        stack = list(reversed(roots))
        while stack:
            node = stack.pop()
            if node.id in seen:
                continue
            seen.add(node.id)
            out.append(node)
            stack.extend(by_id[c] for c in reversed(self.children.get(node.id, ())))
        out.extend(n for n in self.nodes if n.id not in seen)
        return out


def load_execution_trace(path: PathLike) -> ExecutionTrace:
    """Parse the execution trace in ``path``; ``InputError`` names the file and the field."""
    where = str(path)
    obj = read_json_object(path, "PyTorch execution trace")
    nodes_raw = obj.get("nodes")
    if nodes_raw is None:
        raise InputError(
            "missing: not a PyTorch execution trace (ExecutionTraceObserver writes "
            '{"schema": ..., "nodes": [...]})',
            where=where,
            field="nodes",
        )
    if not isinstance(nodes_raw, list):
        raise InputError(
            f"must be a list, got {type(nodes_raw).__name__}", where=where, field="nodes"
        )
    schema = obj.get("schema")
    schema_str = schema if isinstance(schema, str) else ""
    nodes = [_node(raw, i, where, schema_str) for i, raw in enumerate(nodes_raw)]
    seen: set[int] = set()
    for i, n in enumerate(nodes):
        if n.id in seen:
            raise InputError(f"node id {n.id} appears twice", where=where, field=f"nodes[{i}].id")
        seen.add(n.id)
    nodes.sort(key=lambda n: n.id)
    children: dict[int, list[int]] = {}
    for n in nodes:
        if n.parent != n.id:
            children.setdefault(n.parent, []).append(n.id)
    return ExecutionTrace(
        path=where,
        schema=schema_str,
        nodes=tuple(nodes),
        children={k: tuple(v) for k, v in children.items()},
    )


def _int(value: Any, where: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"must be an integer, got {value!r}", where=where, field=field)
    return value


def _node(raw: Any, i: int, where: str, schema: str) -> EtNode:
    path = f"nodes[{i}]"
    if not isinstance(raw, dict):
        raise InputError(f"must be an object, got {type(raw).__name__}", where=where, field=path)
    for key in ("id", "name", "ctrl_deps"):
        if key not in raw:
            raise InputError("missing required key", where=where, field=f"{path}.{key}")
    name = raw["name"]
    if not isinstance(name, str):
        raise InputError(f"must be a string, got {name!r}", where=where, field=f"{path}.name")
    attrs = _attrs(raw.get("attrs", []), where, f"{path}.attrs")
    return EtNode(
        id=_int(raw["id"], where, f"{path}.id"),
        name=name,
        parent=_int(raw["ctrl_deps"], where, f"{path}.ctrl_deps"),
        rf_id=_attr_int(attrs, "rf_id", 0, where, f"{path}.attrs"),
        seq=_attr_int(attrs, "seq_id", NO_SEQ, where, f"{path}.attrs"),
        scope=_attr_int(attrs, "scope", SCOPE_FUNCTION, where, f"{path}.attrs"),
        tid=_attr_int(attrs, "tid", 0, where, f"{path}.attrs"),
        inputs=_tensors(raw.get("inputs"), where, f"{path}.inputs", schema),
        outputs=_tensors(raw.get("outputs"), where, f"{path}.outputs", schema),
    )


def _attrs(raw: Any, where: str, path: str) -> dict[str, Any]:
    if not isinstance(raw, list):
        raise InputError(f"must be a list, got {type(raw).__name__}", where=where, field=path)
    out: dict[str, Any] = {}
    for k, a in enumerate(raw):
        if not isinstance(a, dict) or not isinstance(a.get("name"), str):
            raise InputError(
                'must be an object with a "name" and a "value"', where=where, field=f"{path}[{k}]"
            )
        out[a["name"]] = a.get("value")
    return out


def _attr_int(attrs: Mapping[str, Any], key: str, default: int, where: str, path: str) -> int:
    if key not in attrs:
        return default
    value = attrs[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(
            f"attribute {key!r} must be an integer, got {value!r}", where=where, field=path
        )
    return value


def _tensors(raw: Any, where: str, path: str, schema: str) -> tuple[TensorRef, ...]:
    """The tensor arguments of ``inputs``/``outputs`` (tensor lists flattened, in order)."""
    if raw is None:
        return ()
    if isinstance(raw, list):
        # Early schemas kept inputs as a bare list beside "input_shapes"/"input_types".
        raise InputError(
            f"an older execution-trace layout (schema {schema or 'unknown'!r}: a list, not "
            '{"values", "shapes", "types"}); record it again with a recent torch',
            where=where,
            field=path,
        )
    if not isinstance(raw, dict):
        raise InputError(f"must be an object, got {type(raw).__name__}", where=where, field=path)
    values, shapes, types = raw.get("values", []), raw.get("shapes", []), raw.get("types", [])
    if not (isinstance(values, list) and isinstance(shapes, list) and isinstance(types, list)):
        raise InputError("values, shapes and types must be lists", where=where, field=path)
    if not (len(values) == len(types) and len(shapes) in (0, len(values))):
        raise InputError(
            f"values, shapes and types differ in length ({len(values)}, {len(shapes)}, "
            f"{len(types)})",
            where=where,
            field=path,
        )
    out: list[TensorRef] = []
    for k, (value, typ) in enumerate(zip(values, types, strict=True)):
        if isinstance(typ, str) and "Tensor" in typ:
            shape = shapes[k] if shapes else []
            _collect(value, shape, typ, out)
    return tuple(out)


def _collect(value: Any, shape: Any, typ: str, out: list[TensorRef]) -> None:
    if _is_tensor_value(value):
        dims = shape if isinstance(shape, list) and all(_is_int(d) for d in shape) else []
        out.append(
            TensorRef(
                tensor_id=value[0],
                storage_id=value[1],
                numel=value[3],
                itemsize=value[4],
                shape=tuple(dims),
                dtype=_dtype_of(typ),
            )
        )
        return
    if isinstance(value, list):
        inner = _split_list_type(typ)
        shapes = shape if isinstance(shape, list) and len(shape) == len(value) else []
        for j, v in enumerate(value):
            t = inner[j] if j < len(inner) else (inner[-1] if inner else typ)
            _collect(v, shapes[j] if shapes else [], t, out)
    # Anything else (None for an optional tensor, an undefined tensor) carries no tensor.


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_tensor_value(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == _TENSOR_VALUE_LEN
        and all(_is_int(v) for v in value[:5])
        and isinstance(value[5], str)
    )


# How the execution trace spells the dtypes a gradient may have (C++ type names), as torch
# names them (the trace format's ``dtype``).
_TORCH_DTYPE_NAMES = {
    "float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
    "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
    "unsigned char": "uint8", "bool": "bool",
}  # fmt: skip


def torch_dtype_name(et_dtype: str) -> str:
    """The dtype the execution trace spells ``et_dtype`` as torch names it (``"c10::Half"`` ->
    ``"float16"``); ``""`` for one it does not know (the trace then records none)."""
    return _TORCH_DTYPE_NAMES.get(et_dtype, "")


def _dtype_of(typ: str) -> str:
    # "Tensor(float)" -> "float"; a list element type is resolved by _split_list_type first.
    start, end = typ.find("("), typ.rfind(")")
    return typ[start + 1 : end] if typ.startswith("Tensor(") and end > start else ""


def _split_list_type(typ: str) -> Sequence[str]:
    """``GenericList[Tensor(float),Tensor(float)]`` -> the element types, split at top level."""
    start, end = typ.find("["), typ.rfind("]")
    if start < 0 or end <= start:
        return []
    body = typ[start + 1 : end]
    parts: list[str] = []
    depth = 0
    cur = ""
    for ch in body:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return parts
