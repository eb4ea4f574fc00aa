"""pace.verify: every rule of the trace and schedule contracts, and the Lemma-1 check against a
brute-force reference."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pace.errors import InputError, ScheduleMismatchError
from pace.io import load_trace, trace_digest
from pace.ir import CommModel, Op, Schedule, Slice, Tensor, Trace, Unit
from pace.synth import random_trace
from pace.verify import verify_schedule, verify_trace
from tests.strategies import traces

TINY = Path(__file__).parent / "data" / "tiny.trace.json"


def tiny() -> Trace:
    return load_trace(TINY)


def mk(
    ops: list[tuple[str, list[str]]],
    tensors: list[tuple[str, str, list[str]]],
    *,
    duration_us: float = 1.0,
) -> Trace:
    return Trace(
        model="t",
        ops=tuple(
            Op(name=n, phase="backward", duration_us=duration_us, deps=tuple(d)) for n, d in ops
        ),
        tensors=tuple(
            Tensor(name=n, size_bytes=8, producer=p, consumers=tuple(c)) for n, p, c in tensors
        ),
        comm=CommModel(workers=2, alpha_us=0.0, beta_us_per_byte=1.0),
    )


def fails(trace: Trace, field: str, pattern: str) -> None:
    with pytest.raises(InputError) as info:
        verify_trace(trace, where="x.json")
    err = info.value
    assert err.where == "x.json"
    assert err.field == field, str(err)
    assert re.search(pattern, err.detail), str(err)
    assert str(err).startswith(f"x.json: {field}: ")


@settings(max_examples=60)
@given(trace=traces())
def test_random_traces_verify(trace: Trace) -> None:
    verify_trace(trace)


def test_tiny_verifies() -> None:
    verify_trace(tiny())


def test_duplicate_names() -> None:
    fails(mk([("a", []), ("a", [])], [("w", "a", [])]), "ops[1].name", r"duplicate op name 'a'")
    fails(
        mk([("a", []), ("b", ["a"])], [("w", "a", ["b"]), ("w", "a", ["b"])]),
        "tensors[1].name",
        r"duplicate tensor name 'w' \(first at tensors\[0\]\)",
    )


def test_unknown_references() -> None:
    fails(mk([("a", ["zz"])], [("w", "a", [])]), "ops[0].deps[0]", r"op 'zz' does not exist")
    fails(mk([("a", [])], [("w", "bw.fc", [])]), "tensors[0].producer", r"op 'bw.fc' does not")
    fails(
        mk([("a", [])], [("w", "a", []), ("v", "a", ["a2"])]),
        "tensors[1].consumers[0]",
        r"op 'a2' does not exist",
    )


def test_cycle_is_printed() -> None:
    t = mk([("a", ["c"]), ("b", ["a"]), ("c", ["b"]), ("d", [])], [("w", "d", [])])
    with pytest.raises(InputError) as info:
        verify_trace(t)
    msg = str(info.value)
    assert "dependency cycle" in msg
    cycle = msg.split("dependency cycle: ")[1].split(" -> ")
    assert cycle[0] == cycle[-1]
    assert sorted(cycle[:-1]) == ["a", "b", "c"]
    assert info.value.field.startswith("ops[")


def test_self_dependency_is_a_cycle() -> None:
    fails(mk([("a", ["a"])], [("w", "a", [])]), "ops[0].deps", r"dependency cycle: a -> a")


def test_numbers() -> None:
    t = tiny()
    for bad in (-1.0, float("nan"), float("inf"), True):
        op = dataclasses.replace(t.ops[2], duration_us=bad)
        fails(dataclasses.replace(t, ops=(*t.ops[:2], op, t.ops[3])), "ops[2].duration_us", "")
    for bad_size in (0, -4, 4.0, True):
        ten = dataclasses.replace(t.tensors[1], size_bytes=bad_size)
        fails(
            dataclasses.replace(t, tensors=(t.tensors[0], ten)),
            "tensors[1].bytes",
            r"integer > 0",
        )
    fails(
        dataclasses.replace(t, comm=dataclasses.replace(t.comm, workers=0)),
        "comm.workers",
        r">= 1",
    )
    fails(
        dataclasses.replace(t, comm=dataclasses.replace(t.comm, alpha_us=float("nan"))),
        "comm.alpha_us",
        "finite",
    )
    fails(
        dataclasses.replace(t, comm=dataclasses.replace(t.comm, beta_us_per_byte=-1e-9)),
        "comm.beta_us_per_byte",
        ">= 0",
    )
    fails(
        dataclasses.replace(t, ops=(dataclasses.replace(t.ops[0], phase="fwd"), *t.ops[1:])),  # type: ignore[arg-type]
        "ops[0].phase",
        "must be one of",
    )


def test_needs_a_tensor() -> None:
    fails(dataclasses.replace(tiny(), tensors=()), "tensors", "at least one")


def test_lemma1_direct_and_transitive_across_tensors() -> None:
    # Producer of v runs after 'f1', a consumer of w: the window is not "backward then forward".
    t = mk(
        [("b1", []), ("f1", ["b1"]), ("x", ["f1"]), ("b2", ["x"]), ("f2", ["b2"])],
        [("w", "b1", ["f1"]), ("v", "b2", ["f2"])],
    )
    fails(
        t,
        "tensors[1].producer",
        r"producer 'b2' of tensor 'v' depends on 'f1', a consumer of tensor 'w' "
        r"\(path f1 -> x -> b2\)",
    )
    # A producer that is itself a consumer.
    t2 = mk([("a", []), ("b", ["a"])], [("w", "a", ["b"]), ("v", "b", [])])
    fails(t2, "tensors[1].producer", r"'b' of tensor 'v' is itself a consumer of tensor 'w'")
    # A tensor consumed by its own producer.
    fails(mk([("a", [])], [("w", "a", ["a"])]), "tensors[0].producer", "itself a consumer")


def test_consumer_before_unrelated_producer_is_fine() -> None:
    # f1 consumes w but nothing depends on f1 before b2: Lemma 1 holds.
    t = mk(
        [("b1", []), ("b2", ["b1"]), ("f1", ["b2"]), ("f2", ["f1"])],
        [("w", "b1", ["f1"]), ("v", "b2", ["f2"])],
    )
    verify_trace(t)


@st.composite
def random_dags(draw: st.DrawFn) -> Trace:
    """Arbitrary small DAGs with arbitrary producer/consumer choices (valid or not)."""
    n = draw(st.integers(1, 9))
    ops = []
    for i in range(n):
        deps = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        ops.append((f"o{i}", [f"o{j}" for j in sorted(deps)]))
    k = draw(st.integers(1, 4))
    tensors = []
    for j in range(k):
        p = draw(st.integers(0, n - 1))
        cs = draw(st.sets(st.integers(0, n - 1), max_size=3))
        tensors.append((f"t{j}", f"o{p}", [f"o{c}" for c in sorted(cs)]))
    return mk(ops, tensors)


def lemma1_holds_brute_force(t: Trace) -> bool:
    g: nx.DiGraph[str] = nx.DiGraph()
    g.add_nodes_from(op.name for op in t.ops)
    g.add_edges_from((d, op.name) for op in t.ops for d in op.deps)
    consumers = {c for ten in t.tensors for c in ten.consumers}
    after = set(consumers)
    for c in consumers:
        after |= nx.descendants(g, c)
    return all(ten.producer not in after for ten in t.tensors)


@settings(max_examples=300)
@given(t=random_dags())
def test_lemma1_agrees_with_brute_force(t: Trace) -> None:
    if lemma1_holds_brute_force(t):
        verify_trace(t)
    else:
        with pytest.raises(InputError, match="Lemma-1"):
            verify_trace(t)


# --- schedules -------------------------------------------------------------------------------


def sched(
    t: Trace, units: list[tuple[float, list[tuple[str, int, int]]]], **kw: object
) -> Schedule:
    fields: dict[str, object] = {
        "trace_digest": trace_digest(t),
        "cost_model": t.comm,
        "units": tuple(
            Unit(
                priority=p,
                slices=tuple(Slice(tensor=n, offset_bytes=o, size_bytes=b) for n, o, b in sl),
            )
            for p, sl in units
        ),
        "predicted_iteration_us": 39.0,
    }
    fields.update(kw)
    return Schedule(**fields)  # type: ignore[arg-type]


GOOD = [
    (10.0, [("layer2.weight", 0, 10)]),
    (20.0, [("layer1.weight", 0, 4)]),
    (24.0, [("layer2.weight", 10, 10)]),
]


def sfails(s: Schedule, field: str, pattern: str, exc: type[InputError] = InputError) -> None:
    with pytest.raises(exc) as info:
        verify_schedule(s, tiny(), where="s.json")
    assert info.value.field == field, str(info.value)
    assert re.search(pattern, info.value.detail), str(info.value)
    assert str(info.value).startswith(f"s.json: {field}: ")


def test_good_schedule_and_fused_unit() -> None:
    t = tiny()
    verify_schedule(sched(t, GOOD), t)
    verify_schedule(sched(t, [(1.0, [("layer1.weight", 0, 4), ("layer2.weight", 0, 20)])]), t)


def test_schedule_digest_mismatch() -> None:
    s = sched(tiny(), GOOD, trace_digest="sha256:" + "0" * 64)
    sfails(s, "trace_digest", "compiled for trace", ScheduleMismatchError)


def test_schedule_coverage_errors() -> None:
    t = tiny()
    sfails(
        sched(t, [(1.0, [("layer2.weight", 0, 10)]), (2.0, [("layer1.weight", 0, 4)])]),
        "units",
        r"tensor 'layer2.weight': bytes \[10, 20\) are not covered",
    )
    sfails(
        sched(t, [(1.0, [("layer2.weight", 5, 15)]), (2.0, [("layer1.weight", 0, 4)])]),
        "units",
        r"bytes \[0, 5\) are not covered",
    )
    sfails(
        sched(t, [*GOOD, (30.0, [("layer2.weight", 8, 4)])]),
        "units[3].slices[0]",
        r"tensor 'layer2.weight': bytes \[8, 10\) are also covered by units\[0\].slices\[0\]",
    )
    sfails(
        sched(t, [(1.0, [("layer2.weight", 0, 20)])]),
        "units",
        r"tensor 'layer1.weight' \(4 bytes\) is not covered by any slice",
    )
    sfails(
        sched(t, [*GOOD, (3.0, [("layer9", 0, 1)])]),
        "units[3].slices[0].tensor",
        r"tensor 'layer9' does not exist",
    )
    sfails(
        sched(t, [(1.0, [("layer1.weight", 2, 4)])]),
        "units[0].slices[0]",
        r"bytes \[2, 6\) run past the end of tensor 'layer1.weight' \(4 bytes\)",
    )


def test_schedule_numbers() -> None:
    t = tiny()
    sfails(sched(t, [(float("nan"), GOOD[0][1]), *GOOD[1:]]), "units[0].priority", "finite")
    sfails(sched(t, GOOD, predicted_iteration_us=-1.0), "predicted_iteration_us", ">= 0")
    sfails(sched(t, [(1.0, [])]), "units[0].slices", "must be a non-empty list")
    sfails(sched(t, [(1.0, [("layer1.weight", 0, 0)])]), "units[0].slices[0].bytes", "> 0")
    sfails(sched(t, [(1.0, [("layer1.weight", 0.0, 4)])]), "units[0].slices[0].offset", "integer")
    sfails(
        sched(t, GOOD, cost_model=CommModel(workers=0, alpha_us=0, beta_us_per_byte=1)),
        "cost_model.workers",
        ">= 1",
    )


@settings(max_examples=60)
@given(trace=traces(max_layers=6), data=st.data())
def test_random_partitions_verify_and_any_dropped_slice_is_a_gap(
    trace: Trace, data: st.DataObject
) -> None:
    slices = []
    for ten in trace.tensors:
        cuts = sorted(
            data.draw(st.sets(st.integers(1, max(1, ten.size_bytes - 1)), max_size=3))
            - {ten.size_bytes}
        )
        bounds = [0, *cuts, ten.size_bytes]
        slices += [(ten.name, a, b - a) for a, b in itertools.pairwise(bounds)]
    order = data.draw(st.permutations(slices))
    units = [(float(i), [s]) for i, s in enumerate(order)]
    verify_schedule(sched(trace, units), trace)
    drop = data.draw(st.integers(0, len(units) - 1))
    with pytest.raises(InputError, match="not covered"):
        verify_schedule(sched(trace, units[:drop] + units[drop + 1 :]), trace)


def test_large_trace_verifies() -> None:
    # 50,000 ops / 5,000 tensors: the linear-time checks keep this well under a second
    # (measured, not asserted: no timing assertions in tests).
    t = random_trace(seed=1, n_layers=2500, ops_per_layer=20, tensors_per_layer=(2, 2))
    assert len(t.ops) == 50_000
    verify_trace(t)


ir_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.just(("bw.layer1",)),
    st.just(["fw.layer2", 3]),
    st.just((1, 2.0)),
    st.just(((1, 2.0), (3,))),
    st.just([[1]]),
)


@settings(max_examples=300)
@given(data=st.data())
def test_ir_built_in_python_with_junk_fields_gives_input_error_only(data: st.DataObject) -> None:
    # Another stage may build a Trace/Schedule by hand: verify must report junk as InputError,
    # never crash with TypeError/KeyError.
    t = tiny()
    s = sched(t, GOOD)
    target = data.draw(st.sampled_from(["op", "tensor", "comm", "unit", "slice", "schedule"]))
    value = data.draw(ir_junk)
    if target == "op":
        i = data.draw(st.integers(0, len(t.ops) - 1))
        field = data.draw(st.sampled_from(["name", "phase", "duration_us", "deps"]))
        ops = list(t.ops)
        ops[i] = dataclasses.replace(ops[i], **{field: value})
        t = dataclasses.replace(t, ops=tuple(ops))
    elif target == "tensor":
        i = data.draw(st.integers(0, len(t.tensors) - 1))
        field = data.draw(st.sampled_from(["name", "size_bytes", "producer", "consumers"]))
        tensors = list(t.tensors)
        tensors[i] = dataclasses.replace(tensors[i], **{field: value})
        t = dataclasses.replace(t, tensors=tuple(tensors))
    elif target == "comm":
        field = data.draw(st.sampled_from(["workers", "alpha_us", "beta_us_per_byte", "samples"]))
        t = dataclasses.replace(t, comm=dataclasses.replace(t.comm, **{field: value}))
    elif target == "unit":
        units = list(s.units)
        field = data.draw(st.sampled_from(["priority", "slices"]))
        units[0] = dataclasses.replace(units[0], **{field: value})
        s = dataclasses.replace(s, units=tuple(units))
    elif target == "slice":
        field = data.draw(st.sampled_from(["tensor", "offset_bytes", "size_bytes"]))
        units = list(s.units)
        sl = dataclasses.replace(units[1].slices[0], **{field: value})
        units[1] = dataclasses.replace(units[1], slices=(sl,))
        s = dataclasses.replace(s, units=tuple(units))
    else:
        field = data.draw(st.sampled_from(["trace_digest", "predicted_iteration_us"]))
        s = dataclasses.replace(s, **{field: value})
    try:
        verify_trace(t)
        if target in ("unit", "slice", "schedule"):
            verify_schedule(s, t)
    except InputError:
        pass


def test_bounds_hold_for_traces_built_in_python() -> None:
    """The bounds of docs/trace-format.md, "Bounds", for a Trace that never was a file."""
    t = tiny()
    for bad in (1e308, 86_400e6 * 2, 5e-324):
        op = dataclasses.replace(t.ops[2], duration_us=bad)
        fails(dataclasses.replace(t, ops=(*t.ops[:2], op, t.ops[3])), "ops[2].duration_us", "")
    big = dataclasses.replace(t.tensors[0], size_bytes=2**48 + 4)
    fails(dataclasses.replace(t, tensors=(big, t.tensors[1])), "tensors[0].bytes", r"2\*\*48")
    half = [dataclasses.replace(x, size_bytes=2**47 + 4) for x in t.tensors]
    fails(dataclasses.replace(t, tensors=tuple(half)), "tensors[1].bytes", "together")
    fails(
        dataclasses.replace(t, comm=dataclasses.replace(t.comm, workers=2**20 + 1)),
        "comm.workers",
        r"<= 1048576",
    )
    fails(
        dataclasses.replace(t, comm=dataclasses.replace(t.comm, beta_us_per_byte=1e-300)),
        "comm.beta_us_per_byte",
        r"0 or >= 1e-100",
    )
    # A huge Python int is reported without converting it to 10,000 digits.
    huge = dataclasses.replace(t.tensors[0], size_bytes=10**5000)
    fails(dataclasses.replace(t, tensors=(huge, t.tensors[1])), "tensors[0].bytes", "16610 bits")


def test_long_cycle_and_odd_names_give_one_short_line() -> None:
    names = [f"op{i:04d}" for i in range(4000)]
    ops = [(name, [names[i - 1]]) for i, name in enumerate(names)]
    with pytest.raises(InputError) as info:
        verify_trace(mk(ops, [("w", names[0], [])]), where="x.json")
    message = str(info.value)
    assert "\n" not in message
    assert len(message) < 300
    assert "... (+" in message
    odd = "line1\nline2\x1b[31m" + "x" * 10_000
    with pytest.raises(InputError) as info:
        verify_trace(mk([(odd, [odd])], [("w", odd, [])]), where="x.json")
    message = str(info.value)
    assert "\n" not in message
    assert "\x1b" not in message
    assert "line1\\nline2\\x1b[31m" in message
    assert len(message) < 300
