"""The runtime keeps the monitor on: pace.drift must import without torch, scipy, pulp, networkx."""

from __future__ import annotations

import subprocess
import sys


def test_pace_drift_imports_light() -> None:
    code = (
        "import sys, pace.drift, pace.drift.monitor, pace.drift.replan; "
        "print(sorted(m for m in ('torch', 'scipy', 'pulp', 'networkx', 'skopt') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
