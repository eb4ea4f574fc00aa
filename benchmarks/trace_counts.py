"""Counts of the shipped traces next to PACE Table II (all-reduce and computation operators).

Usage: python benchmarks/trace_counts.py [TRACE ...]   (default: traces/*.json.gz)
"""

from __future__ import annotations

import sys
from pathlib import Path

from pace.io import load_trace

# PACE (INFOCOM'20) Table II: parameters (M), all-reduce operators, computation operators.
TABLE_II: dict[str, tuple[float, int, int]] = {
    "torchvision:vgg16": (138.4, 32, 80),
    "torchvision:resnet50": (25.5, 157, 335),
    "pace:lstm-seq2seq": (67.2, 32, 293),
    "pace:transformer": (91.8, 164, 1061),
}


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or sorted(Path("traces").glob("*.json.gz"))
    header = (
        f"{'model':24} {'params M':>9} {'(paper)':>8} {'all-reduce':>10} {'(paper)':>8} "
        f"{'compute fw+bw':>14} {'(paper)':>8} {'bytes MB':>9} {'window ms':>10}"
    )
    print(header)
    print("-" * len(header))
    for path in paths:
        t = load_trace(path)
        fw = sum(1 for o in t.ops if o.phase == "forward")
        bw = sum(1 for o in t.ops if o.phase == "backward")
        params_m = t.meta.get("parameters", 0) / 1e6
        paper = TABLE_II.get(t.model)
        pp, pa, pc = (f"{paper[0]:.1f}", str(paper[1]), str(paper[2])) if paper else ("-",) * 3
        window_ms = sum(o.duration_us for o in t.ops) / 1e3
        print(
            f"{t.model:24} {params_m:9.1f} {pp:>8} {len(t.tensors):10d} {pa:>8} "
            f"{f'{fw}+{bw}={fw + bw}':>14} {pc:>8} {t.total_bytes / 1e6:9.1f} {window_ms:10.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
