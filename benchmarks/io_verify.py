"""Cost of loading, verifying and digesting traces of growing size (CPU seconds, median of 3).

Run: ``python benchmarks/io_verify.py``. Results are recorded in docs/trace-format.md.
Synthetic traces from ``pace.synth.random_trace`` with 20 ops and 2 tensors per layer.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pace.io import load_json, save_trace, trace_digest, trace_from_dict
from pace.synth import random_trace
from pace.verify import verify_trace


def cpu_s(fn: Callable[[], object], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main() -> None:
    from pace.cli._output import print_table

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for layers in (25, 250, 2500):
            trace = random_trace(
                seed=1, n_layers=layers, ops_per_layer=20, tensors_per_layer=(2, 2)
            )
            for name in ("t.json", "t.json.gz"):
                path = Path(tmp) / name
                save_s = cpu_s(lambda t=trace, p=path: save_trace(t, p))
                obj = load_json(path)
                rows.append(
                    [
                        len(trace.ops),
                        len(trace.tensors),
                        name.split(".", 1)[1],
                        path.stat().st_size // 1024,
                        save_s,
                        cpu_s(lambda p=path: load_json(p)),
                        cpu_s(lambda o=obj: trace_from_dict(o)),
                        cpu_s(lambda t=trace: verify_trace(t)),
                        cpu_s(lambda t=trace: trace_digest(t)),
                    ]
                )
    print_table(
        "pace.io / pace.verify cost (CPU s, median of 3)",
        ["ops", "tensors", "file", "KiB", "save", "json", "parse", "verify", "digest"],
        [[*r[:4], *(f"{x:.3f}" for x in r[4:])] for r in rows],
    )


if __name__ == "__main__":
    main()
