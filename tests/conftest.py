from __future__ import annotations

import os

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
