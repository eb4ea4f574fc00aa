"""Reading the result objects that multi-rank test workers print on a shared stdout."""

from __future__ import annotations

import json
from typing import Any


def marked_results(stdout: str, marker: str) -> list[dict[str, Any]]:
    """Every JSON object printed right after ``marker``, in output order.

    Ranks share one pipe, so a line may hold the tail of another rank's output: each object is
    decoded from its marker on rather than line by line.
    """
    out = []
    decoder = json.JSONDecoder()
    at = stdout.find(marker)
    while at >= 0:
        res, _ = decoder.raw_decode(stdout, at + len(marker))
        out.append(res)
        at = stdout.find(marker, at + len(marker))
    return out
