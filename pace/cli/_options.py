"""Command-line options shared by several subcommands."""

from __future__ import annotations

import argparse


def add_what_if_options(p: argparse.ArgumentParser) -> None:
    """``--bandwidth-gbps``, ``--workers``, ``--compute-speedup`` (``compiler.apply_what_if``)."""
    p.add_argument(
        "--bandwidth-gbps",
        type=float,
        metavar="X",
        help="what-if: re-derive the trace's all-reduce cost for this link bandwidth",
    )
    p.add_argument(
        "--workers", type=int, metavar="W", help="what-if: re-derive the cost for W workers"
    )
    p.add_argument(
        "--compute-speedup",
        type=float,
        metavar="X",
        help="what-if: computation X times faster than profiled (e.g. a GPU vs this CPU)",
    )
