"""Fuzzing the loaders and the CLI.

First the loaders: mutated valid traces and schedules either load and verify, or raise
``InputError`` (never any other exception), and ``pace validate`` never exits with anything but
0 or 2 (one stderr line). Then the whole CLI, one hypothesis test per class of issue 17
(``benchmarks/fuzz_cli.py`` holds the strategies and the judge, and runs many thousand cases
with ``python benchmarks/fuzz_cli.py``): every command exits 0 or 2 with one short printable
line naming the file or flag, within a per-case time limit, refuses every value outside the
documented bounds and accepts every valid one.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.fuzz_cli import (
    Case,
    cycle_cases,
    file_cases,
    name_cases,
    number_cases,
    observed_cases,
    option_cases,
    run_case,
    structure_cases,
    zero_cases,
)
from pace.cli import main
from pace.errors import InputError
from pace.io import load_schedule, load_trace, trace_to_dict
from tests.strategies import traces

DATA = Path(__file__).parent / "data"
TINY = load_trace(DATA / "tiny.trace.json")
TINY_SCHEDULE = json.loads((DATA / "tiny.schedule.json").read_text())

Path_ = tuple[str | int, ...]

junk_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.just([]),
    st.just({}),
    st.just(["bw.layer1"]),
    st.just("bw.layer1"),
    st.lists(st.integers(-3, 3), max_size=3),
)


def all_paths(obj: Any, prefix: Path_ = ()) -> list[Path_]:
    out: list[Path_] = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += all_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += all_paths(v, (*prefix, i))
    return out


def parent_of(obj: Any, path: Path_) -> Any:
    for key in path[:-1]:
        obj = obj[key]
    return obj


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> str:
    obj = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in all_paths(obj) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = parent_of(obj, path)
        key = path[-1]
        kind = draw(st.sampled_from(["delete", "replace", "nan", "reorder", "duplicate", "rename"]))
        if kind == "delete":
            del parent[key]
        elif kind == "replace":
            # A copy: st.just([]) hands out one shared list, which a later edit would grow.
            parent[key] = copy.deepcopy(draw(junk_values))
        elif kind == "nan":
            parent[key] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        elif kind == "reorder" and isinstance(parent[key], list):
            parent[key] = draw(st.permutations(parent[key]))
        elif kind == "duplicate" and isinstance(parent, list):
            parent.append(json.loads(json.dumps(parent[key])))
        elif kind == "rename" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["name", "bytes", "x", "deps", "format"]))] = parent.pop(
                key
            )
    text = json.dumps(obj, allow_nan=True)
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(text)))
        text = text[:cut]
    if draw(st.integers(0, 9)) == 0:
        pos = draw(st.integers(0, len(text)))
        text = text[:pos] + draw(st.text(max_size=4)) + text[pos:]
    return text


@st.composite
def mutated_traces(draw: st.DrawFn) -> str:
    trace = draw(st.one_of(st.just(TINY), traces(max_layers=3)))
    return draw(mutated(trace_to_dict(trace)))


def _loads_or_one_line_error(path: Path, text: str, load: Callable[[Path], object]) -> None:
    """``load(path)`` either succeeds or raises an ``InputError`` of one line naming ``path``."""
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    message = ""
    try:
        load(path)
    except InputError as exc:
        message = str(exc)
    if message:
        assert message.startswith(str(path))
        assert "\n" not in message


@settings(max_examples=300)
@given(text=mutated_traces())
def test_mutated_traces_load_or_raise_input_error(tmp_path_factory: Any, text: str) -> None:
    _loads_or_one_line_error(tmp_path_factory.mktemp("fz") / "t.json", text, load_trace)


@settings(max_examples=300)
@given(text=mutated(TINY_SCHEDULE))
def test_mutated_schedules_load_or_raise_input_error(tmp_path_factory: Any, text: str) -> None:
    _loads_or_one_line_error(
        tmp_path_factory.mktemp("fz") / "s.json", text, lambda p: load_schedule(p, trace=TINY)
    )


@settings(max_examples=100)
@given(text=st.one_of(mutated_traces(), mutated(TINY_SCHEDULE)))
def test_validate_cli_exits_0_or_2_with_one_line(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("fz") / "f.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    args = ["validate", str(path)]
    if '"pace.schedule"' in text:
        args += ["--trace", str(DATA / "tiny.trace.json")]
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(args)
    assert code in (0, 2)
    if code == 2:
        assert err.getvalue().count("\n") == 1
        assert "Traceback" not in err.getvalue()
    else:
        assert err.getvalue() == ""


# --------------------------------------------------------------------------------------------
# The CLI, class by class. Per case: 20 s before it counts as a hang (SIGALRM); a few ms each
# in practice, so the whole file stays well under a minute on the shared 2-core machine.


def _passes(case: Case) -> None:
    outcome = run_case(case, time_limit_s=20.0)
    assert outcome.passed, f"{outcome.verdict}: {outcome.detail}"


@settings(max_examples=300)
@given(case=number_cases())
def test_numbers_at_the_edges(case: Case) -> None:
    """64-bit and float limits, 4,300+ digit literals, subnormals, each bound and one past it."""
    _passes(case)


@settings(max_examples=60)
@given(case=observed_cases())
def test_run_statistics_at_the_edges(case: Case) -> None:
    """``pace recompile --observed``: a run's statistics with edge numbers (median, fit)."""
    _passes(case)


@settings(max_examples=100)
@given(case=zero_cases())
def test_all_zero_or_all_at_the_bounds(case: Case) -> None:
    """Every duration and cost zero (compare divided by zero), or every one at its bound."""
    _passes(case)


@settings(max_examples=200)
@given(case=name_cases())
def test_odd_names(case: Case) -> None:
    """Lone surrogates refused; newlines, escapes, 10,000 characters: one line, no crash."""
    _passes(case)


@settings(max_examples=20)
@given(case=cycle_cases())
def test_long_cycles_give_one_short_line(case: Case) -> None:
    _passes(case)


@settings(max_examples=300)
@given(case=option_cases())
def test_flag_values_blame_the_flag(case: Case) -> None:
    """Every numeric flag at its edges, ``-o ''``, a schedule's meta.compute_speedup."""
    _passes(case)


@settings(max_examples=16)
@given(case=file_cases())
def test_non_regular_inputs(case: Case) -> None:
    """A FIFO, /dev/zero, /dev/null, a directory, a gzip bomb: refused at once, one line."""
    _passes(case)


@settings(max_examples=200)
@given(case=structure_cases())
def test_broken_structure_through_every_command(case: Case) -> None:
    _passes(case)
