"""Runtime plans: a schedule is refused unless it is exactly the model's parameters (no torch)."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pace.errors import InputError, ScheduleMismatchError
from pace.ir import CommModel, Schedule, Slice, Unit
from pace.runtime.plan import ParamInfo, partition_params, plan_from_schedule, wfbp_plan

PARAMS = [
    ParamInfo(name="a.weight", numel=6, element_size=4, dtype="float32"),
    ParamInfo(name="a.bias", numel=2, element_size=4, dtype="float32"),
    ParamInfo(name="b.weight", numel=4, element_size=4, dtype="float32"),
]


def sched(*units: tuple[float, list[tuple[str, int, int]]]) -> Schedule:
    return Schedule(
        trace_digest="sha256:x",
        cost_model=CommModel(workers=2, alpha_us=1.0, beta_us_per_byte=0.0),
        units=tuple(
            Unit(
                priority=prio,
                slices=tuple(Slice(tensor=t, offset_bytes=o, size_bytes=n) for t, o, n in sl),
            )
            for prio, sl in units
        ),
        predicted_iteration_us=0.0,
    )


GOOD = sched(
    (3.0, [("a.weight", 12, 12)]),
    (1.0, [("b.weight", 0, 16), ("a.bias", 0, 8)]),
    (2.0, [("a.weight", 0, 12)]),
)


def test_plan_orders_by_priority_and_converts_bytes_to_elements() -> None:
    plan = plan_from_schedule(GOOD, PARAMS)
    assert [u.priority for u in plan.units] == [1.0, 2.0, 3.0]
    assert [(p.param, p.start, p.stop) for p in plan.units[0].pieces] == [(2, 0, 4), (1, 0, 2)]
    assert [(p.param, p.start, p.stop) for p in plan.units[1].pieces] == [(0, 0, 3)]
    assert [(p.param, p.start, p.stop) for p in plan.units[2].pieces] == [(0, 3, 6)]
    assert plan.pieces_per_param == (2, 1, 1)
    assert plan.describe(2, PARAMS) == "unit 2 (a.weight[3:6])"
    assert plan.describe(0, PARAMS) == "unit 0 (b.weight, a.bias)"


def test_ties_keep_file_order() -> None:
    s = sched((1.0, [("a.weight", 0, 24)]), (1.0, [("a.bias", 0, 8)]), (1.0, [("b.weight", 0, 16)]))
    plan = plan_from_schedule(s, PARAMS)
    assert [u.pieces[0].param for u in plan.units] == [0, 1, 2]


def test_unknown_tensor_is_a_mismatch_naming_it() -> None:
    s = sched(
        (1.0, [("a.weight", 0, 24), ("a.bias", 0, 8), ("b.weight", 0, 16)]), (2.0, [("c", 0, 4)])
    )
    with pytest.raises(ScheduleMismatchError, match=r"m\.json: units: .*'c'"):
        plan_from_schedule(s, PARAMS, where="m.json")


def test_missing_parameter_is_a_mismatch_naming_it() -> None:
    s = sched((1.0, [("a.weight", 0, 24), ("a.bias", 0, 8)]))
    with pytest.raises(ScheduleMismatchError, match=r"without any slice: 'b.weight'"):
        plan_from_schedule(s, PARAMS)


def test_size_mismatch_is_refused() -> None:
    s = sched((1.0, [("a.weight", 0, 24), ("a.bias", 0, 8), ("b.weight", 0, 12)]))
    with pytest.raises(ScheduleMismatchError, match=r"covers 12 bytes of 'b.weight'.* 16 bytes"):
        plan_from_schedule(s, PARAMS)
    s = sched((1.0, [("a.weight", 0, 24), ("a.bias", 0, 8), ("b.weight", 0, 20)]))
    with pytest.raises(ScheduleMismatchError, match=r"units\[0\]\.slices\[2\]"):
        plan_from_schedule(s, PARAMS)


@pytest.mark.parametrize(
    ("slices", "message"),
    [
        ([("a.weight", 0, 10), ("a.weight", 10, 14)], "element size 4"),
        ([("a.weight", 0, 16), ("a.weight", 12, 12)], "overlaps"),
        ([("a.weight", 0, 8), ("a.weight", 12, 12)], "gap at 2"),
    ],
)
def test_slices_must_tile_elements(slices: list[tuple[str, int, int]], message: str) -> None:
    s = sched((1.0, [*slices, ("a.bias", 0, 8), ("b.weight", 0, 16)]))
    with pytest.raises(InputError, match=message):
        plan_from_schedule(s, PARAMS)


def test_fused_unit_must_have_one_dtype() -> None:
    params = [*PARAMS[:2], ParamInfo(name="b.weight", numel=8, element_size=2, dtype="bfloat16")]
    s = sched((1.0, [("a.weight", 0, 24), ("a.bias", 0, 8), ("b.weight", 0, 16)]))
    with pytest.raises(InputError, match="mixes"):
        plan_from_schedule(s, params)


def test_wfbp_plan_is_reverse_registration_order() -> None:
    plan = wfbp_plan(PARAMS)
    assert [u.pieces[0].param for u in plan.units] == [2, 1, 0]
    assert all(
        u.pieces[0].start == 0 and u.pieces[0].stop == PARAMS[u.pieces[0].param].numel
        for u in plan.units
    )


@given(
    sizes=st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=8),
    partition_bytes=st.integers(min_value=1, max_value=512),
)
def test_partitions_tile_every_parameter_in_priority_order(
    sizes: list[int], partition_bytes: int
) -> None:
    params = [
        ParamInfo(name=f"p{i}", numel=n, element_size=4, dtype="float32")
        for i, n in enumerate(sizes)
    ]
    plan = partition_params(params, partition_bytes)
    step = max(1, partition_bytes // 4)
    for i, info in enumerate(params):
        pieces = [p for u in plan.units for p in u.pieces if p.param == i]
        assert pieces[0].start == 0
        assert pieces[-1].stop == info.numel
        assert all(a.stop == b.start for a, b in itertools.pairwise(pieces))
        assert all(p.numel <= step for p in pieces)
        assert plan.pieces_per_param[i] == len(pieces)
    # Layer order, then offset: the input layer's partitions have the highest priority.
    keys = [(u.pieces[0].param, u.pieces[0].start) for u in plan.units]
    assert keys == sorted(keys)
    assert [u.priority for u in plan.units] == sorted(u.priority for u in plan.units)


def test_runtime_imports_without_compiler_dependencies() -> None:
    code = (
        "import sys\n"
        "for m in ('pulp', 'scipy', 'networkx', 'highspy'):\n"
        "    sys.modules[m] = None  # any import of them now raises ImportError\n"
        "import pace.runtime\n"
        "import pace.runtime.engine, pace.runtime.backends\n"
        "assert 'horovod' not in sys.modules, 'horovod must load only for its backend'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
