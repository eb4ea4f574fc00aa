"""``pace.options`` (every option set, defined once) and ``pace.checks`` (one int/number check).

The option sets are held to every place that still keeps a registry or a list of its own (the
simulator's policy registry, the LP's backends, ...), and the CLI's ``choices=`` to the sets.
"""

from __future__ import annotations

import argparse
import ast
import math
from pathlib import Path
from typing import get_args

import pytest

from pace import options
from pace.checks import is_int, is_number, require_int, require_number, shown
from pace.errors import InputError

ROOT = Path(__file__).resolve().parent.parent


def test_every_tuple_is_its_literal() -> None:
    pairs = [
        (options.Phase, options.PHASES),
        (options.ScheduleMode, options.SCHEDULE_MODES),
        (options.FusionMethod, options.FUSION_METHODS),
        (options.MaxMinAlgorithm, options.MAXMIN_ALGORITHMS),
        (options.Solver, options.SOLVERS),
        (options.LpBackend, options.LP_BACKENDS),
        (options.PolicyName, options.POLICY_NAMES),
        (options.TimelineFormat, options.TIMELINE_FORMATS),
        (options.ProfileTiming, options.PROFILE_TIMINGS),
        (options.ImportTiming, options.IMPORT_TIMINGS),
        (options.CommBenchBackend, options.COMM_BENCH_BACKENDS),
        (options.RuntimeBackend, options.RUNTIME_BACKENDS),
        (options.DriftEventKind, options.DRIFT_EVENT_KINDS),
    ]
    for literal, values in pairs:
        assert get_args(literal) == values
        assert values
        assert len(set(values)) == len(values)


def test_options_imports_nothing_from_pace() -> None:
    tree = ast.parse((ROOT / "pace" / "options.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0
            assert not (node.module or "").startswith("pace")
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("pace") for a in node.names)


def test_ir_re_exports_its_sets() -> None:
    from pace import ir

    assert ir.SCHEDULE_MODES is options.SCHEDULE_MODES
    assert ir.PHASES is options.PHASES
    assert ir.ScheduleMode is options.ScheduleMode
    assert ir.Phase is options.Phase


def test_registries_match_the_sets() -> None:
    from pace import compiler, fusion, lp, sim
    from pace.importer import TIMINGS
    from pace.lp.model import BACKENDS

    # The simulator's registry is the source of the policies: same names, same order.
    assert tuple(sim.POLICIES) == options.POLICY_NAMES
    assert tuple(lp.SOLVERS) == options.SOLVERS
    assert tuple(BACKENDS) == tuple(lp.BACKENDS) == options.LP_BACKENDS
    assert tuple(fusion.METHODS) == options.FUSION_METHODS
    assert tuple(compiler.FUSION_METHODS) == options.FUSION_METHODS
    assert tuple(compiler.SOLVERS) == options.SOLVERS
    assert tuple(TIMINGS) == options.IMPORT_TIMINGS


def test_torch_side_registries_match_the_sets() -> None:
    pytest.importorskip("torch")
    from pace.profiler.comm import BACKENDS
    from pace.profiler.window import Timing
    from pace.runtime.optimizer import BackendName

    assert tuple(BACKENDS) == options.COMM_BENCH_BACKENDS
    assert get_args(Timing) == options.PROFILE_TIMINGS
    assert get_args(BackendName) == options.RUNTIME_BACKENDS


def _choices(command: str) -> dict[str, tuple[str, ...]]:
    from pace.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices[command]
    return {a.dest: tuple(a.choices) for a in p._actions if a.choices is not None}


def test_cli_choices_are_the_sets() -> None:
    assert _choices("compile") == {
        "fusion": options.FUSION_METHODS,
        "solver": options.SOLVERS,
        "mode": options.SCHEDULE_MODES,
    }
    assert _choices("recompile") == {
        "fusion": options.FUSION_METHODS,
        "solver": options.SOLVERS,
    }
    assert _choices("timeline")["format"] == options.TIMELINE_FORMATS
    assert _choices("import")["timing"] == options.IMPORT_TIMINGS
    assert _choices("profile")["timing"] == options.PROFILE_TIMINGS
    assert _choices("profile-comm")["backend"] == options.COMM_BENCH_BACKENDS


# ---------------------------------------------------------------------------------------------
# pace.checks


def test_predicates() -> None:
    assert is_int(3)
    assert is_int(-(2**200))
    assert not is_int(True)
    assert not is_int(3.0)
    assert not is_int("3")
    assert not is_int(None)
    assert is_number(3)
    assert is_number(2.5)
    assert is_number(math.nan)
    assert not is_number(False)
    assert not is_number("1")
    assert not is_number(None)
    assert not is_number(math.inf, finite=True)
    assert not is_number(math.nan, finite=True)
    # An integer float() cannot convert is not a finite number.
    assert is_number(2**1000, finite=True)
    assert not is_number(10**400, finite=True)
    assert shown(10**5000) == "an integer of 16610 bits"
    assert shown("x") == "'x'"


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (0, {"where": "--workers", "minimum": 1}, "--workers: must be an integer >= 1, got 0"),
        (2.5, {"where": "--workers", "minimum": 1}, "--workers: must be an integer >= 1, got 2.5"),
        (True, {"field": "samples", "minimum": 1}, "samples: must be an integer >= 1, got True"),
        (
            0,
            {"field": "u.bytes", "above": 0, "name": "bytes"},
            "u.bytes: bytes must be an integer > 0, got 0",
        ),
        ("7", {"field": "iteration"}, "iteration: must be an integer, got '7'"),
        (9, {"where": "f.json", "field": "n", "maximum": 8}, "f.json: n: must be <= 8, got 9"),
    ],
)
def test_require_int_refuses(value: object, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InputError) as info:
        require_int(value, **kwargs)  # type: ignore[arg-type]
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)  # callers that catch ValueError keep working


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (-1, {"where": "--bandwidth-gbps", "above": 0}, "--bandwidth-gbps: must be > 0, got -1"),
        (math.nan, {"where": "--bw", "above": 0}, "--bw: must be a finite number > 0, got nan"),
        (
            True,
            {"field": "[0]", "minimum": 0, "name": "us"},
            "[0]: us must be a finite number >= 0, got True",
        ),
        (-0.5, {"field": "op_sd", "minimum": 0}, "op_sd: must be >= 0, got -0.5"),
        (2.0, {"field": "f", "minimum": 0, "maximum": 1}, "f: must be <= 1, got 2.0"),
        (math.inf, {}, "must be a finite number, got inf"),
    ],
)
def test_require_number_refuses(value: object, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InputError) as info:
        require_number(value, **kwargs)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_require_accepts() -> None:
    assert require_int(5, minimum=5, maximum=5) == 5
    assert require_int(1, above=0) == 1
    value = require_number(3, above=0)
    assert value == 3.0
    assert isinstance(value, float)
    assert require_number(0, minimum=0) == 0.0
