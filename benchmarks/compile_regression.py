"""Pin what `pace compile` decides: predicted times, bounds, baselines and the units themselves.

    python benchmarks/compile_regression.py --write tests/data/compile_regression.json
    python benchmarks/compile_regression.py --check tests/data/compile_regression.json [--full]

Each case compiles one trace (the four shipped real-model traces under what-if cost models, the
random traces of the benchmarks, both modes, every fusion method, both solvers) and records
``predicted_iteration_us``, ``lower_bound_us``, every baseline's replay and a hash of the
schedule's units. A refactoring of the pipeline must reproduce every record (times to 1e-9
relative, units exactly); ``tests/test_compile_regression.py`` checks the quick cases,
``--full`` adds the whole bench_models grid.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pace.compiler import compile_trace
from pace.io import load_trace
from pace.ir import Trace
from pace.synth import random_trace

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("resnet50", "vgg16", "transformer", "lstm_seq2seq")
REL_TOL = 1e-9


def _shipped(name: str) -> Trace:
    return load_trace(ROOT / "traces" / f"{name}.json.gz")


def cases(full: bool) -> Iterator[tuple[str, Trace, dict[str, Any]]]:
    """(case name, trace, compile_trace keyword arguments)."""
    grid = [(s, b) for s in (10.0, 30.0, 100.0) for b in (10.0, 25.0)] if full else [(30.0, 10.0)]
    for name in SHIPPED:
        trace = _shipped(name)
        for speedup, bw in grid:
            kw = {"compute_speedup": speedup, "bandwidth_gbps": bw, "workers": 8}
            yield f"{name}-x{speedup:g}-{bw:g}G", trace, kw
    resnet = _shipped("resnet50")
    what_if = {"compute_speedup": 30.0, "bandwidth_gbps": 10.0, "workers": 8}
    yield "resnet50-paper", resnet, {**what_if, "fusion": "paper", "baselines": False}
    yield "resnet50-none", resnet, {**what_if, "fusion": "none", "baselines": False}
    yield "resnet50-sync", resnet, {**what_if, "mode": "sync"}
    yield "resnet50-nominal", resnet, {**what_if, "robust": False, "baselines": False}
    for seed in range(5):
        trace = random_trace(seed=seed, n_layers=20, alpha_us=40.0)
        yield f"random-{seed}", trace, {}
    yield "random-lp", random_trace(seed=11, n_layers=12, integer=True), {"solver": "lp"}
    yield "random-noalpha", random_trace(seed=12, n_layers=30), {}
    # bench_compile's smallest size (200 tensors, ~1,500 ops) and bench_fusion's many tiny tensors.
    yield (
        "bench-compile-200",
        random_trace(seed=1, n_layers=100, tensors_per_layer=(1, 3), ops_per_layer=15),
        {},
    )
    yield (
        "bench-fusion-60",
        random_trace(seed=3, n_layers=60, tensors_per_layer=(3, 8), alpha_us=60.0),
        {"baselines": False},
    )


def units_hash(res: Any) -> str:
    rows = [
        (u.priority, [(s.tensor, s.offset_bytes, s.size_bytes) for s in u.slices])
        for u in res.schedule.units
    ]
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def record(trace: Trace, kw: dict[str, Any]) -> dict[str, Any]:
    res = compile_trace(trace, **kw)
    return {
        "predicted_iteration_us": res.predicted_iteration_us,
        "lower_bound_us": res.lower_bound_us,
        "baselines": dict(sorted(res.baselines.items())),
        "units": len(res.schedule.units),
        "units_sha": units_hash(res),
    }


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-9)


def differences(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Human-readable differences between two records (empty: the same)."""
    out: list[str] = []
    for key in ("predicted_iteration_us", "lower_bound_us"):
        if not _close(want[key], got[key]):
            out.append(f"{key}: {want[key]!r} -> {got[key]!r}")
    if set(want["baselines"]) != set(got["baselines"]):
        out.append(f"baselines: {sorted(want['baselines'])} -> {sorted(got['baselines'])}")
    for name, us in want["baselines"].items():
        if name in got["baselines"] and not _close(us, got["baselines"][name]):
            out.append(f"baseline {name}: {us!r} -> {got['baselines'][name]!r}")
    for key in ("units", "units_sha"):
        if want[key] != got[key]:
            out.append(f"{key}: {want[key]!r} -> {got[key]!r}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, help="record every case into this JSON file")
    group.add_argument("--check", type=Path, help="compare every case with this JSON file")
    ap.add_argument("--full", action="store_true", help="the whole bench_models grid too")
    args = ap.parse_args()
    if args.write:
        from pace.io import write_atomic

        data = {name: record(trace, kw) for name, trace, kw in cases(args.full)}
        write_atomic(args.write, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
        print(f"wrote {len(data)} cases to {args.write}")
        return 0
    want_all = json.loads(args.check.read_text())
    bad = 0
    for name, trace, kw in cases(args.full):
        if name not in want_all:
            print(f"{name}: not recorded")
            bad += 1
            continue
        diff = differences(want_all[name], record(trace, kw))
        print(f"{name}: {'same' if not diff else 'DIFFERENT'}")
        for line in diff:
            print(f"    {line}")
        bad += bool(diff)
    print(f"{bad} case(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
