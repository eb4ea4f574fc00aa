"""Lower bounds on the iteration time of any policy."""

from __future__ import annotations

from pace.errors import SolverError
from pace.ir import Trace
from pace.sim.prepared import prepare


def compute_critical_path_us(trace: Trace) -> float:
    """Makespan of the window with free, instant communication: a lower bound for any policy."""
    return prepare(trace).critical_path_us


def lower_bound_us(trace: Trace) -> tuple[float, str]:
    """The best available lower bound and its name.

    The zero-overhead optimal preemptive makespan (``pace.lp.lower_bound_us``), else (its
    solver failed) the compute critical path.
    """
    from pace.lp import lower_bound_us as lp_lower_bound_us

    try:
        return float(lp_lower_bound_us(trace)), "optimal-preemptive"
    except SolverError:
        # A bound is a reference line, not worth failing a comparison over.
        return compute_critical_path_us(trace), "critical-path"
