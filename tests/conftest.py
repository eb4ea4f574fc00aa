from __future__ import annotations

import importlib
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# CI is a shared 2-core machine: no wall-clock deadlines in property tests, fixed example
# budgets so a run's length does not depend on the machine's load.
settings.register_profile(
    "pace",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("CI") == "true",
)
settings.load_profile("pace")


# `make test` (and so CI) sets PACE_REQUIRE_EXTRAS=1: there torch and Horovod are installed by
# the Makefile, and a test that skips for want of them would hide a broken install. Outside it
# (a bare `pytest` without the extras) the torch/Horovod tests skip with their reason.
REQUIRE_EXTRAS = os.environ.get("PACE_REQUIRE_EXTRAS") == "1"


def pytest_sessionstart(session: pytest.Session) -> None:
    if not REQUIRE_EXTRAS:
        return
    for module in ("torch", "torchvision", "horovod.torch", "hta.trace_analysis"):
        try:
            importlib.import_module(module)
        except Exception as exc:  # any import failure means the environment is broken
            raise pytest.UsageError(
                f"PACE_REQUIRE_EXTRAS=1 but {module} does not import: {exc}"
            ) from None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    # A GPU is no extra a machine can install: `cuda` tests skip on CI's machines by design.
    needs_gpu = item.get_closest_marker("cuda") is not None
    if REQUIRE_EXTRAS and report.skipped and not hasattr(report, "wasxfail") and not needs_gpu:
        report.outcome = "failed"
        report.longrepr = f"skipped under PACE_REQUIRE_EXTRAS=1: {report.longrepr}"
