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
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.fuzz_cli import (
    Case,
    cycle_cases,
    file_cases,
    mutated_text,
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


def mutated(base: dict[str, Any]) -> st.SearchStrategy[str]:
    """The fuzzer's own mutation (``benchmarks/fuzz_cli.py``), as text."""
    return mutated_text(base).map(lambda b: b.decode("utf-8", errors="surrogatepass"))


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
        # A valid file may still earn a documented warning (e.g. a schedule whose priorities
        # are not in its replay's start order): one line each, never a traceback.
        assert all(ln.startswith("pace: warning: ") for ln in err.getvalue().splitlines())


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
