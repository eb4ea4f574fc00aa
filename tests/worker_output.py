"""Multi-rank test workers: their environment and port, and the result objects they print on a
shared stdout."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def worker_env() -> dict[str, str]:
    """The environment of a launched worker: this checkout importable, one OpenMP thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


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
