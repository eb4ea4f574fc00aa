"""Fuzz the pace CLI as an outsider would: mutated traces, schedules and flag values (issue 17).

    python benchmarks/fuzz_cli.py                 # 6,000 mutants, 20 s per case, seed 0
    python benchmarks/fuzz_cli.py --mutants 20000 --seed 3 --time-limit 30

Every case is one command line (``validate``, ``simulate``, ``compare``, ``compile``,
``timeline``) run through the real entry point, ``pace.cli.main``, in this process, on files
written to a fresh directory. Hypothesis draws the cases (``tests/test_fuzz.py`` runs the same
strategies in the normal suite, where a failure shrinks to a minimal case); here every draw is
run and tallied instead of stopping at the first failure. A case **passes** when the command

* exits 0, or exits 2 with exactly one stderr line, printable, at most 300 characters, starting
  ``pace: `` and naming what was mutated (the file, and the JSON path where the case knows it; the
  flag for a flag value); anything else, an exception escaping ``main`` included, counts as a
  **traceback**;
* returns within the per-case time limit (SIGALRM), else it counts as a **hang**;
* accepts no **garbage**: a value outside the documented bounds (docs/trace-format.md,
  "Bounds") must be refused, and an accepted run may print only finite numbers (``--json``
  output is parsed strictly), and a schedule it writes must validate against its trace;
* and refuses nothing valid: an in-bounds value in a file a trace-only command reads must be
  accepted (a **wrong refusal**), except for a documented work limit (docs/simulator.md).

The classes of mutation are those of the issue: ``numbers`` (edge values in every number field:
64-bit and float limits, 4,300+ digit literals, subnormals, the bounds and one past them, in
``meta`` too), ``zero`` (every duration and cost zero, or all at their bounds), ``names``
(lone surrogates, newlines, terminal escapes, 10,000 characters, renamed consistently; cycles
of thousands of long names), ``options`` (every numeric flag at its edges, ``-o ''``, a
schedule's ``meta.compute_speedup``), ``files`` (FIFO, ``/dev/zero``, a directory, a gzip bomb)
and ``structure`` (deleted, replaced, reordered, duplicated and renamed keys, truncation, junk).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import gzip
import io
import json
import math
import multiprocessing
import os
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pace.cli import main  # noqa: E402
from pace.io import (  # noqa: E402
    MAX_BETA_US_PER_BYTE,
    MAX_COMPUTE_SPEEDUP,
    MAX_DURATION_US,
    MAX_ITEMS,
    MAX_JSON_INT,
    MAX_TENSOR_BYTES,
    MAX_WORKERS,
    MIN_COMPUTE_SPEEDUP,
    MIN_NONZERO_BETA_US_PER_BYTE,
    MIN_NONZERO_US,
    schedule_to_dict,
    trace_digest,
    trace_from_dict,
    trace_to_dict,
)
from pace.options import POLICY_NAMES  # noqa: E402

DATA = ROOT / "tests" / "data"
MAX_LINE_CHARS = 300
POLICIES = POLICY_NAMES
# A refusal for a documented work limit, allowed on valid input (docs/simulator.md, "Work limits").
LIMIT_MARK = "docs/simulator.md, 'Work limits'"

# ---------------------------------------------------------------------------------------------
# Cases


@dataclass(frozen=True)
class Case:
    """One command line on files of one directory.

    ``expect``: ``"refuse"`` (exit 2 required), ``"accept"`` (exit 0 required, or a documented
    work limit), ``"either"``. For a refusal, the error line must start with ``pace: `` then
    one of ``blame`` (paths relative to the case directory, or flag names), then ``field``.
    """

    cls: str
    files: tuple[tuple[str, bytes], ...]
    argv: tuple[str, ...]
    expect: str
    blame: tuple[str, ...] = ()
    field: str = ""
    note: str = ""
    # The case's mutation may put "nan"/"inf" in names: table output cannot be scanned then.
    free_text: bool = False


@dataclass(frozen=True)
class Outcome:
    verdict: str  # ok | refused | traceback | hang | garbage | wrong-refusal | bad-message
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict in ("ok", "refused")


VERDICTS = ("ok", "refused", "traceback", "hang", "garbage", "wrong-refusal", "bad-message")


class _Raw:
    """A literal written into the JSON text as is (``1e400``, a 5,000-digit integer, ``NaN``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text[:30]!r})"


def dump(obj: Any) -> bytes:
    """JSON text of ``obj``; ``_Raw`` values are spliced in verbatim."""
    raws: list[str] = []

    def swap(v: Any) -> Any:
        if isinstance(v, _Raw):
            raws.append(v.text)
            return f"\x00RAW{len(raws) - 1}\x00"
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(obj), allow_nan=True)
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\x00RAW{i}\x00"), raw)
    # A lone surrogate is written as its JSON escape (ensure_ascii), as a hostile file would.
    return text.encode("utf-8")


# ---------------------------------------------------------------------------------------------
# Base documents: valid traces and schedules that mutations start from


@dataclass(frozen=True)
class Base:
    name: str
    trace: dict[str, Any]
    schedule: dict[str, Any]


@functools.cache
def bases() -> tuple[Base, ...]:
    from pace.compiler import compile_trace
    from pace.synth import random_trace

    tiny_trace = json.loads((DATA / "tiny.trace.json").read_text())
    tiny_schedule = json.loads((DATA / "tiny.schedule.json").read_text())
    out = [Base("tiny", tiny_trace, tiny_schedule)]
    for seed, alpha in ((1, 20.0), (2, 0.0)):
        trace = random_trace(seed=seed, n_layers=3, ops_per_layer=3, alpha_us=alpha)
        if seed == 1:
            # Measured samples, so that their numbers are mutated too.
            comm = dataclasses.replace(trace.comm, samples=((1024, 30.5), (1 << 20, 900.0)))
            trace = dataclasses.replace(trace, comm=comm)
        else:
            # fp32 elements, so that element_bytes is mutated too.
            tensors = tuple(dataclasses.replace(t, element_bytes=4) for t in trace.tensors)
            trace = dataclasses.replace(trace, tensors=tensors)
        schedule = compile_trace(trace, baselines=False).schedule
        out.append(Base(f"synth{seed}", trace_to_dict(trace), schedule_to_dict(schedule)))
    return tuple(out)


def numeric_paths(obj: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    if isinstance(obj, bool):
        return []
    if isinstance(obj, int | float):
        return [prefix]
    out: list[tuple[str | int, ...]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k not in ("version",):
                out += numeric_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += numeric_paths(v, (*prefix, i))
    return out


def json_path(path: tuple[str | int, ...]) -> str:
    """The path as pace's messages write it: ``tensors[0].bytes``, ``meta."a.b"``."""
    text = ""
    for key in path:
        if isinstance(key, int):
            text += f"[{key}]"
            continue
        odd = not key or not key.isprintable() or any(c in key for c in ".[] ")
        name = json.dumps(key) if odd else key
        text += f".{name}" if text else name
    return text


def set_at(obj: Any, path: tuple[str | int, ...], value: Any) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


# Documented bounds (docs/trace-format.md, "Bounds") of each number field, by JSON path:
# (integer?, lowest, highest, smallest nonzero). Anything else need only be a finite number.
_RULES: tuple[tuple[str, bool, float, float, float], ...] = (
    (r"ops\[\d+\]\.duration_us", False, 0, MAX_DURATION_US, MIN_NONZERO_US),
    (r"tensors\[\d+\]\.bytes", True, 1, MAX_TENSOR_BYTES, 0),
    (r"tensors\[\d+\]\.element_bytes", True, 1, MAX_JSON_INT, 0),
    (r"(comm|cost_model)\.workers", True, 1, MAX_WORKERS, 0),
    (r"(comm|cost_model)\.alpha_us", False, 0, MAX_DURATION_US, MIN_NONZERO_US),
    (
        r"(comm|cost_model)\.beta_us_per_byte",
        False,
        0,
        MAX_BETA_US_PER_BYTE,
        MIN_NONZERO_BETA_US_PER_BYTE,
    ),
    (r"(comm|cost_model)\.samples\[\d+\]\[0\]", True, 0, MAX_TENSOR_BYTES, 0),
    (r"(comm|cost_model)\.samples\[\d+\]\[1\]", False, 0, MAX_DURATION_US, MIN_NONZERO_US),
    (r"units\[\d+\]\.priority", False, -math.inf, math.inf, 0),
    (r"units\[\d+\]\.slices\[\d+\]\.offset", True, 0, MAX_TENSOR_BYTES, 0),
    (r"units\[\d+\]\.slices\[\d+\]\.bytes", True, 1, MAX_TENSOR_BYTES, 0),
    (r"predicted_iteration_us", False, 0, math.inf, 0),
    (r"meta\..*", False, -math.inf, math.inf, 0),
)


def _literal(value: Any) -> Any:
    """What a number in the file reads as in Python (a raw literal parsed), or None."""
    if not isinstance(value, _Raw):
        return value
    text = value.text
    if re.fullmatch(r"-?\d+", text):
        # Python refuses int() beyond 4,300 digits; such a literal is out of 64 bits anyway.
        return int(text) if len(text.lstrip("-")) <= 30 else None
    try:
        return float(text)
    except ValueError:
        return None


def in_bounds(path: str, value: Any) -> bool:
    """Whether a number ``value`` at JSON path ``path`` is within the documented bounds."""
    value = _literal(value)
    ok = value is not None
    if isinstance(value, int) and not -MAX_JSON_INT - 1 <= value <= MAX_JSON_INT:
        ok = False  # beyond 64 bits, anywhere
    if isinstance(value, float) and not math.isfinite(value):
        ok = False
    rule = next((r for r in _RULES if re.fullmatch(r[0], path)), None)
    if ok and rule is not None:
        _, integer, lo, hi, least = rule
        ok = (isinstance(value, int) or not integer) and lo <= value <= hi
        ok = ok and not 0 < value < least
    return ok


INT_EDGES: tuple[int, ...] = (
    0,
    1,
    -1,
    2,
    3,
    2**31,
    2**32,
    2**40,
    2**48 - 1,
    2**48,
    2**48 + 1,
    2**53 + 1,
    2**62,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    2**64,
    2**70,
    2**1024,
    10**400,
    MAX_WORKERS,
    MAX_WORKERS + 1,
    MAX_ITEMS,
)
FLOAT_EDGES: tuple[float, ...] = (
    0.0,
    -0.0,
    5e-324,
    1e-320,
    1e-300,
    1e-12,
    1e-6,
    0.5,
    1.5,
    4.0,
    1e6,
    math.nextafter(1e6, math.inf),
    MAX_DURATION_US,
    math.nextafter(MAX_DURATION_US, math.inf),
    1e15,
    1e100,
    1e300,
    1e308,
    sys.float_info.max,
    -1e-300,
    -1.0,
    -1e308,
)
RAW_LITERALS: tuple[str, ...] = (
    "1" + "0" * 5000,
    "-" + "9" * 4400,
    "1" * 4301,
    "123456789012345678901234567890",
    "1e400",
    "-1e400",
    "1.0e-400",
    "NaN",
    "Infinity",
    "-Infinity",
    "1E+308",
    "-0",
    "0e0",
    "1" + "0" * 400 + ".5",
)

numbers_st = st.one_of(
    st.sampled_from(INT_EDGES),
    st.sampled_from(FLOAT_EDGES),
    st.sampled_from(RAW_LITERALS).map(_Raw),
    st.integers(-(2**80), 2**80),
    st.floats(allow_nan=False, allow_infinity=False),
)

T_PATH = "t.json"
S_PATH = "s.json"
OUT_PATH = "out.json"


@st.composite
def trace_command(draw: st.DrawFn) -> tuple[str, ...]:
    """A command that reads only the trace ``t.json``."""
    which = draw(st.sampled_from(["validate", "simulate", "compare", "compile", "timeline"]))
    json_flag = draw(st.sampled_from([(), ("--json",)]))
    if which == "validate":
        return ("validate", T_PATH, *json_flag)
    if which == "simulate":
        return ("simulate", T_PATH, "--policy", draw(st.sampled_from(POLICIES)), *json_flag)
    if which == "compare":
        return ("compare", T_PATH, *json_flag)
    if which == "compile":
        solver = draw(st.sampled_from([(), (), (), ("--solver", "lp")]))
        return ("compile", T_PATH, "-o", OUT_PATH, *solver, *json_flag)
    return ("timeline", T_PATH, "-o", OUT_PATH, *json_flag)


@st.composite
def schedule_command(draw: st.DrawFn) -> tuple[str, ...]:
    """A command that reads the trace ``t.json`` and the schedule ``s.json``."""
    which = draw(st.sampled_from(["validate", "validate-alone", "simulate", "compare", "timeline"]))
    json_flag = draw(st.sampled_from([(), ("--json",)]))
    if which == "validate":
        return ("validate", S_PATH, "--trace", T_PATH, *json_flag)
    if which == "validate-alone":
        return ("validate", S_PATH, *json_flag)
    if which == "simulate":
        return ("simulate", T_PATH, "--schedule", S_PATH, *json_flag)
    if which == "compare":
        return ("compare", T_PATH, "--schedule", S_PATH, *json_flag)
    return ("timeline", T_PATH, "--schedule", S_PATH, "-o", OUT_PATH, *json_flag)


def _files(trace: Any, schedule: Any | None) -> tuple[tuple[str, bytes], ...]:
    files = [(T_PATH, trace if isinstance(trace, bytes) else dump(trace))]
    if schedule is not None:
        files.append((S_PATH, schedule if isinstance(schedule, bytes) else dump(schedule)))
    return tuple(files)


def _reads_trace_only(argv: tuple[str, ...]) -> bool:
    return S_PATH not in argv


# ---- numbers --------------------------------------------------------------------------------


@st.composite
def number_cases(draw: st.DrawFn) -> Case:
    """One number, anywhere in a trace or a schedule, set to an edge value."""
    base = draw(st.sampled_from(bases()))
    with_schedule = draw(st.booleans())
    target = draw(st.sampled_from(["trace", "schedule"])) if with_schedule else "trace"
    trace, schedule = copy.deepcopy(base.trace), copy.deepcopy(base.schedule)
    doc = trace if target == "trace" else schedule
    paths = numeric_paths(doc)
    path: tuple[str | int, ...] = draw(st.sampled_from([*paths, ("meta", "x")]))
    value = draw(numbers_st)
    if path[0] == "meta":
        doc.setdefault("meta", {})
    set_at(doc, path, value)
    where = json_path(path)
    argv = draw(schedule_command() if with_schedule else trace_command())
    blame = T_PATH if target == "trace" else S_PATH
    if blame not in argv:
        # validate s.json alone never reads the mutated trace.
        expect, field_ = "accept", ""
    elif not in_bounds(where, value):
        expect, field_ = "refuse", where
    elif _reads_trace_only(argv) and not where.endswith("element_bytes"):
        expect, field_ = "accept", ""
        if where.startswith("tensors[") and where.endswith(".bytes"):
            total = sum(int(_literal(t["bytes"])) for t in trace["tensors"])
            element = int(trace["tensors"][int(path[1])].get("element_bytes", 1))
            if total > MAX_TENSOR_BYTES or int(_literal(value)) % element:
                # Each tensor in bounds but not their sum, or a size that splits an element.
                expect, field_ = "refuse", ""
    else:
        # In bounds, but one number of a consistent pair changed (digest, coverage, prediction).
        expect, field_ = "either", ""
    return Case(
        cls="numbers",
        files=_files(trace, schedule if with_schedule else None),
        argv=argv,
        expect=expect,
        # A consistent pair broken (trace and schedule) may be blamed on either file.
        blame=(blame,) if expect == "refuse" else (T_PATH, S_PATH),
        field=field_,
        note=f"{target} {where} = {value!r}",
    )


@st.composite
def observed_cases(draw: st.DrawFn) -> Case:
    """One number of a run's ``stats.json`` at an edge value, through ``pace recompile``."""
    stats = json.loads((ROOT / "docs" / "examples" / "drift-stats.json").read_text())
    trace = json.loads((DATA / "tiny.trace.json").read_text())
    every = draw(st.booleans())  # one iteration, or the same value in all (the median sees it)
    path = draw(st.sampled_from(numeric_paths(stats["iterations"][0])))
    value = draw(numbers_st)
    for it in stats["iterations"] if every else stats["iterations"][:1]:
        set_at(it, path, value)
    argv = ("recompile", T_PATH, "--observed", "o.json", "-o", OUT_PATH, "--json")
    return Case(
        cls="numbers",
        files=(*_files(trace, None), ("o.json", dump(stats))),
        argv=argv,
        expect="either",
        blame=("o.json",),
        note=f"stats iterations[{'*' if every else 0}].{json_path(path)} = {value!r}",
    )


# ---- zero and extremes ----------------------------------------------------------------------


@st.composite
def zero_cases(draw: st.DrawFn) -> Case:
    """Every duration and cost set to one value: zero, subnormal, or the bounds themselves."""
    base = draw(st.sampled_from(bases()))
    trace = copy.deepcopy(base.trace)
    duration = draw(st.sampled_from([0.0, 0, MIN_NONZERO_US, MAX_DURATION_US, 1.0]))
    alpha = draw(st.sampled_from([0.0, MIN_NONZERO_US, MAX_DURATION_US, 1.0]))
    beta = draw(st.sampled_from([0.0, MIN_NONZERO_BETA_US_PER_BYTE, MAX_BETA_US_PER_BYTE, 1.0]))
    size = draw(st.sampled_from([None, 1, MAX_TENSOR_BYTES // len(trace["tensors"])]))
    for op in trace["ops"]:
        op["duration_us"] = duration
    trace["comm"]["alpha_us"] = alpha
    trace["comm"]["beta_us_per_byte"] = beta
    if size is not None:
        for t in trace["tensors"]:
            t["bytes"] = size
            t.pop("element_bytes", None)
    argv = draw(trace_command())
    return Case(
        cls="zero",
        files=_files(trace, None),
        argv=argv,
        expect="accept",
        note=f"durations {duration}, alpha {alpha}, beta {beta}, bytes {size}",
    )


# ---- names ----------------------------------------------------------------------------------

WEIRD_NAMES: tuple[str, ...] = (
    "\ud800",
    "a\udfffb",
    "a\nb",
    "line1\r\nline2",
    "\x1b[31mred\x1b[0m",
    "tab\there",
    "\u2028sep",
    "\x00nul",
    "\u202eRTL",
    "é.名前.🙂",
    "a" * 10_000,
    " ",
    "x.y[0]",
    '"q"',
    "back\\slash",
    "[/]",
    "[bold red]x[/bold red]",
    ":smile:",
)


def _rename(
    trace: dict[str, Any], schedule: dict[str, Any] | None, kind: str, i: int, new: str
) -> None:
    """Rename op or tensor ``i`` everywhere it is referenced (the file stays consistent)."""
    if kind == "op":
        old = trace["ops"][i]["name"]
        for op in trace["ops"]:
            if op["name"] == old:
                op["name"] = new
            op["deps"] = [new if d == old else d for d in op.get("deps", [])]
        for t in trace["tensors"]:
            if t["producer"] == old:
                t["producer"] = new
            t["consumers"] = [new if c == old else c for c in t.get("consumers", [])]
    else:
        old = trace["tensors"][i]["name"]
        trace["tensors"][i]["name"] = new
        if schedule is not None:
            for u in schedule["units"]:
                for s in u["slices"]:
                    if s["tensor"] == old:
                        s["tensor"] = new
    if schedule is not None:
        schedule["trace_digest"] = trace_digest(trace_from_dict(trace))


@st.composite
def name_cases(draw: st.DrawFn) -> Case:
    """A name replaced everywhere by an odd one; sometimes with an error that quotes it."""
    base = draw(st.sampled_from(bases()))
    trace, schedule = copy.deepcopy(base.trace), copy.deepcopy(base.schedule)
    with_schedule = draw(st.booleans())
    kind = draw(st.sampled_from(["op", "tensor"]))
    items = trace["ops"] if kind == "op" else trace["tensors"]
    i = draw(st.integers(0, len(items) - 1))
    new = draw(st.one_of(st.sampled_from(WEIRD_NAMES), st.text(min_size=1, max_size=12)))
    taken = {x["name"] for x in items}
    while new in taken:  # a rename must not create a duplicate (that is its own error case)
        new = "~" + new
    _rename(trace, schedule if with_schedule else None, kind, i, new)
    if draw(st.booleans()):
        trace["model"] = new  # printed in the titles of compare and simulate tables
    surrogate = any(0xD800 <= ord(c) <= 0xDFFF for c in new)
    error = draw(st.sampled_from(["none", "none", "self-dep", "duplicate", "dangling"]))
    if error == "self-dep" and kind == "op":
        trace["ops"][i]["deps"] = [*trace["ops"][i].get("deps", []), new]
    elif error == "duplicate":
        items.append(copy.deepcopy(items[i]))
    elif error == "dangling":
        trace["tensors"][0]["consumers"] = [*trace["tensors"][0].get("consumers", []), new + "?"]
    else:
        error = "none"
    argv = draw(schedule_command() if with_schedule else trace_command())
    if T_PATH not in argv and (kind == "op" or not surrogate):
        expect = "either"  # validate s.json alone: only a tensor name is in the schedule
    elif surrogate or error != "none":
        expect = "refuse"
    elif _reads_trace_only(argv):
        expect = "accept"
    else:
        expect = "either"  # e.g. a duplicated tensor breaks the schedule's digest
    return Case(
        cls="names",
        files=_files(trace, schedule if with_schedule else None),
        argv=argv,
        expect=expect,
        blame=(T_PATH, S_PATH),
        note=f"{kind} {i} renamed to {new[:20]!r}, error {error}",
        free_text=True,
    )


@st.composite
def cycle_cases(draw: st.DrawFn) -> Case:
    """A dependency cycle through up to 3,000 ops with names up to 300 characters long."""
    n = draw(st.integers(1, 3000))
    width = draw(st.sampled_from([1, 10, 300]))
    names = [f"{i:0{width}d}" for i in range(n)]
    ops = [
        {"name": name, "phase": "backward", "duration_us": 1, "deps": [names[i - 1]]}
        for i, name in enumerate(names)
    ]
    trace = {
        "format": "pace.trace",
        "version": 1,
        "ops": ops,
        "tensors": [{"name": "w", "bytes": 4, "producer": names[0]}],
        "comm": {"workers": 2, "alpha_us": 0, "beta_us_per_byte": 1},
    }
    return Case(
        cls="names",
        files=_files(trace, None),
        argv=("validate", T_PATH),
        expect="refuse",
        blame=(T_PATH,),
        note=f"cycle of {n} ops, names of {width} chars",
    )


# ---- options --------------------------------------------------------------------------------

OPTION_TEXTS: tuple[str, ...] = (
    "0",
    "-1",
    "1",
    "2",
    "1e-320",
    "5e-324",
    "1e-6",
    "1e-3",
    "0.5",
    "0.999",
    "1e6",
    "1e7",
    "1e308",
    "1e400",
    "nan",
    "inf",
    "NaN",
    "1" + "0" * 5000,
    str(2**63),
    str(2**64),
    "1048576",
    "1048577",
    "281474976710656",
    "281474976710657",
    "",
    "x",
    "1_000",
    " 5 ",
    "0x10",
)
_WHAT_IF_COMMANDS: tuple[str, ...] = ("compile", "simulate", "compare", "timeline")
_SIM_COMMANDS: tuple[str, ...] = ("simulate", "compare", "timeline")
# flag -> (integer?, lowest, highest, commands that take it; lo open?, hi open?)
OPTIONS: dict[str, tuple[bool, float, float, tuple[str, ...], bool, bool]] = {
    "--compute-speedup": (
        False,
        MIN_COMPUTE_SPEEDUP,
        MAX_COMPUTE_SPEEDUP,
        _WHAT_IF_COMMANDS,
        False,
        False,
    ),
    "--bandwidth-gbps": (False, 1e-6, 1e6, _WHAT_IF_COMMANDS, False, False),
    "--workers": (True, 1, MAX_WORKERS, _WHAT_IF_COMMANDS, False, False),
    "--credit": (True, 1, MAX_ITEMS, _SIM_COMMANDS, False, False),
    "--credit-bytes": (True, 1, MAX_TENSOR_BYTES, _SIM_COMMANDS, False, False),
    "--robust-tolerance": (False, 0.0, 1.0, ("compile",), False, True),
}


def _parses(text: str, integer: bool) -> float | int | None:
    try:
        return int(text) if integer else float(text)
    except ValueError:
        return None


@st.composite
def option_cases(draw: st.DrawFn) -> Case:
    """One numeric flag at an edge value, ``-o`` odd, or a schedule's recorded speed-up."""
    base = draw(st.sampled_from(bases()))
    kind = draw(st.sampled_from(["flag", "flag", "flag", "output", "meta"]))
    if kind == "meta":
        schedule = copy.deepcopy(base.schedule)
        value = draw(
            st.one_of(
                st.sampled_from([0, -1, 1e-320, 5e-324, 1e-3, 1, 1e6, 1e7, 2**70, True, None]),
                st.sampled_from(["x", [1], {}]),
                st.floats(allow_nan=False, allow_infinity=False),
            )
        )
        schedule.setdefault("meta", {})["compute_speedup"] = value
        meta_argv = draw(schedule_command())
        good = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and MIN_COMPUTE_SPEEDUP <= value <= MAX_COMPUTE_SPEEDUP
        )
        # validate --trace replays with the recorded speed-up: a changed one mismatches.
        expect = "refuse" if not good else ("either" if meta_argv[0] == "validate" else "accept")
        return Case(
            cls="options",
            files=_files(base.trace, schedule),
            argv=meta_argv,
            expect=expect,
            blame=(S_PATH,),
            field="meta.compute_speedup" if not good and "--trace" not in meta_argv else "",
            note=f"meta.compute_speedup = {value!r}",
        )
    if kind == "output":
        out = draw(st.sampled_from(["", ".", "missing/out.json", "sub", "out.json"]))
        command = draw(st.sampled_from(["compile", "timeline"]))
        files = [*_files(base.trace, None), ("sub/keep", b"")]
        good = out == "out.json"
        return Case(
            cls="options",
            files=tuple(files),
            argv=(command, T_PATH, "-o", out),
            expect="accept" if good else "refuse",
            blame=("-o/--output", "missing/out.json"),
            note=f"-o {out!r}",
        )
    flag = draw(st.sampled_from(sorted(OPTIONS)))
    integer, lo, hi, commands, lo_open, hi_open = OPTIONS[flag]
    text = draw(st.one_of(st.sampled_from(OPTION_TEXTS), st.floats().map(repr)))
    command = draw(st.sampled_from(commands))
    if command == "compile":
        argv: tuple[str, ...] = ("compile", T_PATH, "-o", OUT_PATH)
    elif command == "simulate":
        argv = ("simulate", T_PATH, "--policy", draw(st.sampled_from(POLICIES)))
    elif command == "timeline":
        argv = ("timeline", T_PATH, "-o", OUT_PATH)
    else:
        argv = ("compare", T_PATH)
    value = _parses(text, integer)
    good = value is not None and math.isfinite(value)
    if good and value is not None:
        good = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    # Horovod's cycle fusion runs one unit at a time: a credit is refused for it (naming the
    # flag), and compare and timeline's default baseline include it.
    combination = (flag == "--credit" and value != 1) or flag == "--credit-bytes"
    # "=" keeps argparse from reading "-1" or "-inf" as another flag.
    return Case(
        cls="options",
        files=_files(base.trace, None),
        argv=(*argv, f"{flag}={text}", "--json"),
        expect=("either" if combination else "accept") if good else "refuse",
        blame=(flag, f"error: argument {flag}"),
        note=f"{flag}={text[:30]!r}",
    )


# ---- files ----------------------------------------------------------------------------------


@functools.cache
def _gzip_bomb() -> bytes:
    # 300 MiB of spaces: more than MAX_FILE_BYTES once inflated, 300 KiB on disk.
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        chunk = b" " * (1 << 20)
        for _ in range(300):
            gz.write(chunk)
    return out.getvalue()


FILE_KINDS = ("fifo", "dev-zero", "dev-null", "directory", "gzip-bomb", "missing", "empty-name")


@st.composite
def file_cases(draw: st.DrawFn) -> Case:
    """Inputs that are no regular file, or that never end."""
    kind = draw(st.sampled_from(FILE_KINDS))
    base = draw(st.sampled_from(bases()))
    which = draw(st.sampled_from(["trace", "schedule"]))
    files = list(_files(base.trace, base.schedule))
    odd = {
        "fifo": "@fifo",
        "dev-zero": "/dev/zero",
        "dev-null": "/dev/null",
        "directory": "sub",
        "gzip-bomb": "bomb.json.gz",
        "missing": "missing.json",
        "empty-name": "",
    }[kind]
    if kind == "gzip-bomb":
        files.append((odd, _gzip_bomb()))
    if kind == "directory":
        files.append(("sub/keep", b""))
    argv: tuple[str, ...]
    if which == "trace":
        argv = draw(st.sampled_from([("validate", odd), ("compare", odd), ("simulate", odd)]))
        if argv[0] == "simulate":
            argv = (*argv, "--policy", "fifo")
    else:
        argv = draw(
            st.sampled_from(
                [("validate", odd, "--trace", T_PATH), ("simulate", T_PATH, "--schedule", odd)]
            )
        )
    return Case(
        cls="files",
        files=tuple(files),
        argv=argv,
        expect="refuse",
        blame=(odd.removeprefix("@") or "''",),
        note=kind,
    )


# ---- structure ------------------------------------------------------------------------------

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


def _all_paths(obj: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    out: list[tuple[str | int, ...]] = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _all_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _all_paths(v, (*prefix, i))
    return out


@st.composite
def mutated_text(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    """``base`` with one to three random edits, maybe truncated, maybe with junk inserted."""
    obj = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _all_paths(obj) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = obj
        for step in path[:-1]:
            parent = parent[step]
        key: Any = path[-1]
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
            parent.append(copy.deepcopy(parent[key]))
        elif kind == "rename" and isinstance(parent, dict):
            new_key = draw(st.sampled_from(["name", "bytes", "x", "deps", "format"]))
            parent[new_key] = parent.pop(key)
    text = json.dumps(obj, allow_nan=True)
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]
    if draw(st.integers(0, 9)) == 0:
        pos = draw(st.integers(0, len(text)))
        text = text[:pos] + draw(st.text(max_size=4)) + text[pos:]
    return text.encode("utf-8", errors="surrogatepass")


@st.composite
def structure_cases(draw: st.DrawFn) -> Case:
    base = draw(st.sampled_from(bases()))
    with_schedule = draw(st.booleans())
    if with_schedule and draw(st.booleans()):
        files = _files(base.trace, draw(mutated_text(base.schedule)))
        blame: tuple[str, ...] = (S_PATH,)
    else:
        files = _files(draw(mutated_text(base.trace)), base.schedule if with_schedule else None)
        # With a schedule, a trace edit that stays valid shows as the schedule's digest.
        blame = (T_PATH, S_PATH) if with_schedule else (T_PATH,)
    argv = draw(schedule_command() if with_schedule else trace_command())
    return Case(
        cls="structure",
        files=files,
        argv=argv,
        expect="either",
        blame=blame,
        free_text=True,
    )


CLASSES: dict[str, Callable[[], st.SearchStrategy[Case]]] = {
    "numbers": lambda: st.one_of(number_cases(), number_cases(), observed_cases()),
    "zero": zero_cases,
    "names": lambda: st.one_of(name_cases(), cycle_cases()),
    "options": option_cases,
    "files": file_cases,
    "structure": structure_cases,
}


def any_case() -> st.SearchStrategy[Case]:
    return st.one_of(*(make() for make in CLASSES.values()))


# ---------------------------------------------------------------------------------------------
# Running one case


class _Hang(BaseException):
    """Raised by SIGALRM in the case that ran past its time limit (a BaseException, so that no
    ``except Exception`` in pace can swallow it)."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise _Hang


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _materialise(case: Case, root: Path) -> list[str]:
    for name, data in case.files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if "@fifo" in case.argv:
        os.mkfifo(root / "fifo")
    return ["fifo" if arg == "@fifo" else arg for arg in case.argv]


def _call(argv: list[str]) -> tuple[int | None, str, str, str]:
    """``main(argv)``: (exit code or None, stdout, stderr, traceback text if one escaped)."""
    out, err = io.StringIO(), io.StringIO()
    code: int | None = None
    trace = ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code if isinstance(exc.code, int) else 2
        except _Hang:
            raise
        except BaseException:
            trace = traceback.format_exc()
    return code, out.getvalue(), err.getvalue(), trace


def _leaves(v: Any) -> list[Any]:
    """The values of a timed or sized ``--json`` field: itself, or those of a dict's values or a
    list's items, nested (e.g. ``compute_hedge.replays_us``, a list of lists)."""
    if isinstance(v, dict):
        return [x for item in v.values() for x in _leaves(item)]
    if isinstance(v, list):
        return [x for item in v for x in _leaves(item)]
    return [v]


def _finite_numbers(obj: Any, where: str = "") -> str:
    """The path of the first number in ``--json`` output that is not a finite number >= 0
    where a time or a size is expected, else ''."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            bad = _finite_numbers(v, f"{where}.{k}")
            if bad:
                return bad
            # Times must be numbers (print_json writes NaN and infinities as null); sizes may
            # be null (an unset byte window) but never negative.
            # Null only where nothing exists to time: current_us (recompile without --schedule
            # has no current schedule), framework_us (the trace has no comm.framework).
            absent = k in ("current_us", "framework_us") and v is None
            timed = (str(k).endswith("_us") and not absent) or where.endswith(".baselines")
            sized = str(k).endswith("_bytes") and v is not None
            for x in _leaves(v) if timed or sized else ():  # e.g. replayed_us, after_us
                if not (isinstance(x, int | float) and 0 <= x < math.inf):
                    return f"{where}.{k} = {v!r}"
            # Ratios: print_json writes a NaN or an infinity as null.
            if k in ("gap", "speedup_vs_fifo") and not isinstance(v, int | float):
                return f"{where}.{k} = {v!r}"
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            bad = _finite_numbers(v, f"{where}[{i}]")
            if bad:
                return bad
    return ""


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"non-finite JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def _garbage_in_output(case: Case, argv: list[str], stdout: str, root: Path) -> str:
    if "--json" in argv:
        try:
            obj = _strict_json(stdout)
        except ValueError as exc:
            return f"--json output is not strict JSON: {exc}"
        bad = _finite_numbers(obj)
        if bad:
            return f"--json output has {bad}"
    elif not case.free_text and re.search(r"(?<![\w.])-?(nan|inf)(?![\w.])", stdout, re.I):
        return "table output shows nan or inf"
    out = root / OUT_PATH
    if argv[0] == "compile":
        # What compile wrote must validate against the trace it was compiled from.
        code, _, err, trace = _call(["validate", str(out), "--trace", str(root / T_PATH)])
        if code != 0:
            return f"written schedule does not validate: {(trace or err).strip()[-200:]}"
    if argv[0] == "timeline" and out.suffix == ".json":
        try:
            _strict_json(out.read_text(encoding="ascii"))
        except (OSError, ValueError) as exc:
            return f"timeline output is not strict JSON: {exc}"
    return ""


def run_case(case: Case, *, time_limit_s: float = 20.0) -> Outcome:
    """Run ``case`` in a fresh directory (the working directory of the command)."""
    root = Path(tempfile.mkdtemp(prefix="pace-fuzz-"))
    cwd = os.getcwd()
    try:
        argv = _materialise(case, root)
        os.chdir(root)
        try:
            with _time_limit(time_limit_s):
                run = Run(argv, *_call(argv))
                # Judged inside the limit: it validates what compile wrote.
                return judge(case, run, root)
        except _Hang:
            return Outcome("hang", f"over {time_limit_s:g} s: {case.note} {argv[:4]}")
    finally:
        os.chdir(cwd)
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class Run:
    """What one command did."""

    argv: list[str]
    code: int | None
    stdout: str
    stderr: str
    traceback: str


def judge(case: Case, run: Run, root: Path) -> Outcome:
    """The verdict on ``run`` of ``case`` (module docstring)."""
    what = f"{case.note} | {' '.join(a[:40] for a in run.argv)}"
    if run.traceback:
        return Outcome("traceback", f"{run.traceback.strip().splitlines()[-1][:200]} | {what}")
    if run.code not in (0, 2):
        return Outcome("traceback", f"exit {run.code}: {run.stderr.strip()[-200:]} | {what}")
    if run.code == 2:
        return _judge_refusal(case, run, what)
    if case.expect == "refuse":
        return Outcome("garbage", f"accepted: {what}")
    for line in run.stderr.splitlines():
        if not line.startswith("pace: warning: ") or len(line) > MAX_LINE_CHARS:
            return Outcome("bad-message", f"stderr on success: {line[:200]!r} | {what}")
    bad = _garbage_in_output(case, run.argv, run.stdout, root)
    return Outcome("garbage", f"{bad} | {what}") if bad else Outcome("ok")


def _judge_refusal(case: Case, run: Run, what: str) -> Outcome:
    lines = run.stderr.splitlines()
    line = lines[0] if lines else ""
    problem = ""
    if len(lines) != 1 or not run.stderr.endswith("\n"):
        problem = f"{len(lines)} stderr lines: {run.stderr[:200]!r}"
    elif len(line) > MAX_LINE_CHARS or not line.isprintable() or not line.startswith("pace: "):
        problem = f"{line[:200]!r}"
    elif LIMIT_MARK in line and case.expect != "refuse":
        problem = ""  # a work limit of valid input names the policy flag, not a file
    elif case.blame and not any(
        line.startswith(f"pace: {b}") or (b.startswith("error: ") and b in line) for b in case.blame
    ):
        problem = f"does not name {case.blame}: {line[:200]!r}"
    elif case.field and f": {case.field}: " not in line:
        problem = f"does not name {case.field}: {line[:200]!r}"
    if problem:
        return Outcome("bad-message", f"{problem} | {what}")
    if case.expect == "accept" and LIMIT_MARK not in line:
        return Outcome("wrong-refusal", f"{line[:200]!r} | {what}")
    return Outcome("refused")


# ---------------------------------------------------------------------------------------------
# The many-thousand-mutant run


@dataclass
class Tally:
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[tuple[str, Outcome]] = field(default_factory=list)
    slowest: tuple[float, str] = (0.0, "")

    def add(self, case: Case, outcome: Outcome, seconds: float) -> None:
        row = self.counts.setdefault(case.cls, dict.fromkeys(VERDICTS, 0))
        row[outcome.verdict] += 1
        if not outcome.passed:
            self.failures.append((case.cls, outcome))
        if seconds > self.slowest[0]:
            self.slowest = (seconds, f"{case.cls}: {case.note} {' '.join(case.argv)[:80]}")


class Worker:
    """A child process that runs cases one at a time, under a hard deadline.

    SIGALRM inside the child catches a loop in Python code; a loop that never returns to Python
    (a C routine on a gigantic number) or a runaway allocation is caught here: past the deadline
    the child is killed, the case counted as a hang, and a fresh child takes the next case.
    """

    def __init__(self, *, time_limit_s: float, memory_bytes: int) -> None:
        self.time_limit_s = time_limit_s
        self.memory_bytes = memory_bytes
        self._start()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=self._serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def _serve(self, conn: Connection) -> None:
        # The limit binds this child only: a runaway allocation is its MemoryError.
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_bytes, self.memory_bytes))
        while True:
            case = conn.recv()
            if case is None:
                return
            try:
                outcome = run_case(case, time_limit_s=self.time_limit_s)
            except BaseException as exc:  # the harness itself failed: report, keep serving
                outcome = Outcome("traceback", f"harness: {type(exc).__name__}: {exc}")
            conn.send(outcome)

    def run(self, case: Case) -> Outcome:
        self.conn.send(case)
        # The soft limit (SIGALRM) plus time to judge the output and clean up.
        if self.conn.poll(self.time_limit_s * 2 + 10):
            try:
                return self.conn.recv()  # type: ignore[no-any-return]
            except EOFError:
                detail = f"worker died (exit {self.proc.exitcode})"
        else:
            detail = f"no answer in {self.time_limit_s * 2 + 10:g} s"
        self.close(kill=True)
        self._start()
        verdict = "hang" if detail.startswith("no answer") else "traceback"
        return Outcome(verdict, f"{detail}: {case.note} {' '.join(case.argv)[:80]}")

    def close(self, *, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        else:
            with contextlib.suppress(OSError):
                self.conn.send(None)
        self.proc.join(5)
        self.conn.close()


def fuzz(mutants: int, *, seed: int, time_limit_s: float, memory_bytes: int) -> Tally:
    tally = Tally()
    bases()  # built once here, inherited by every worker
    worker = Worker(time_limit_s=time_limit_s, memory_bytes=memory_bytes)

    @hypothesis_seed(seed)
    @settings(
        max_examples=mutants,
        database=None,
        deadline=None,
        phases=[Phase.generate],  # count every draw; no shrinking, no replay
        suppress_health_check=list(HealthCheck),
    )
    @given(case=any_case())
    def one(case: Case) -> None:
        t0 = time.perf_counter()
        outcome = worker.run(case)
        tally.add(case, outcome, time.perf_counter() - t0)

    try:
        one()
    finally:
        worker.close()
    return tally


def report(tally: Tally, seconds: float) -> str:
    cols = ("class", "mutants", "ok", "refused", "tracebacks", "hangs", "garbage")
    extra = ("wrong refusals", "bad messages")
    rows = []
    total = dict.fromkeys(VERDICTS, 0)
    for cls in CLASSES:
        row = tally.counts.get(cls, dict.fromkeys(VERDICTS, 0))
        for k, v in row.items():
            total[k] += v
        rows.append((cls, row))
    rows.append(("all", total))
    lines = [
        "| " + " | ".join((*cols, *extra)) + " |",
        "|---" + "|---:" * (len(cols) + len(extra) - 1) + "|",
    ]
    for cls, row in rows:
        cells = (
            sum(row.values()),
            row["ok"],
            row["refused"],
            row["traceback"],
            row["hang"],
            row["garbage"],
            row["wrong-refusal"],
            row["bad-message"],
        )
        lines.append(f"| {cls} | " + " | ".join(f"{c:,}" for c in cells) + " |")
    lines.append("")
    lines.append(
        f"{seconds:.0f} s in all; slowest case {tally.slowest[0]:.2f} s ({tally.slowest[1]})"
    )
    for cls, outcome in tally.failures[:30]:
        lines.append(f"  {cls} {outcome.verdict}: {outcome.detail[:300]}")
    return "\n".join(lines)


def main_cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=int, default=6000, help="cases to run (default 6000)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument(
        "--time-limit", type=float, default=20.0, help="seconds per case before a hang (20)"
    )
    parser.add_argument(
        "--memory-gib", type=float, default=3.0, help="address-space limit of the worker (3)"
    )
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    tally = fuzz(
        args.mutants,
        seed=args.seed,
        time_limit_s=args.time_limit,
        # A runaway allocation must fail as a MemoryError (a traceback), not take the machine.
        memory_bytes=int(args.memory_gib * 2**30),
    )
    print(report(tally, time.perf_counter() - t0))
    return 0 if not tally.failures else 1


if __name__ == "__main__":
    raise SystemExit(main_cli())
