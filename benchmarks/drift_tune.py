"""Bayesian optimisation of the baselines' knobs on the simulator (scikit-optimize).

ByteScheduler tunes its partition size and credit with Bayesian optimisation (seed 000, Sec. 4.3:
Gaussian-process surrogate, expected improvement); Horovod ships an autotuner for its fusion
threshold and cycle time. To compare pace against the *best-tuned* versions of those systems,
this module runs the same kind of search with the simulator as the (noise-free) objective:

* ``bytescheduler``: ``partition_bytes`` (log scale, 64 KiB .. 256 MiB) and ``credit_units``
  (the credit window in partitions, 1 .. 16; ``credit_bytes = credit_units * partition_bytes``);
* ``horovod``: ``threshold_bytes`` (log scale, 64 KiB .. 512 MiB) and ``cycle_us``
  (log scale, 50 us .. 50 ms).

The objective is ``log(iteration_us)``, so skopt's expected-improvement margin ``xi`` is a
relative (not absolute) improvement whatever the model's time scale. The system's documented
default is always the first point evaluated, so a tuned result is never worse than the default.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pace.errors import InputError
from pace.ir import Trace

__all__ = [
    "BYTESCHEDULER_SPACE",
    "HOROVOD_SPACE",
    "SPACES",
    "Knob",
    "TuneResult",
    "bayes_minimize",
    "knob_policy",
    "simulate_knobs",
    "tune",
]

KIB = 1024
MIB = 1024 * KIB

Knobs = Mapping[str, float]


@dataclass(frozen=True, kw_only=True, slots=True)
class Knob:
    """One dimension of a search space."""

    name: str
    low: float
    high: float
    log: bool = False
    integer: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ValueError(
                f"knob {self.name}: need finite low < high, got {self.low}, {self.high}"
            )
        if self.log and self.low <= 0:
            raise ValueError(f"knob {self.name}: a log-scale knob needs low > 0")

    def clip(self, value: float) -> float:
        v = min(max(value, self.low), self.high)
        return float(round(v)) if self.integer else float(v)


BYTESCHEDULER_SPACE: tuple[Knob, ...] = (
    Knob(name="partition_bytes", low=64 * KIB, high=256 * MIB, log=True, integer=True),
    Knob(name="credit_units", low=1, high=16, integer=True),
)
HOROVOD_SPACE: tuple[Knob, ...] = (
    Knob(name="threshold_bytes", low=64 * KIB, high=512 * MIB, log=True, integer=True),
    Knob(name="cycle_us", low=50.0, high=50_000.0, log=True),
)
SPACES: Mapping[str, tuple[Knob, ...]] = {
    "bytescheduler": BYTESCHEDULER_SPACE,
    "horovod": HOROVOD_SPACE,
}


def _unknown(policy: str) -> InputError:
    return InputError(
        f"no knob space for policy {policy!r}; tunable: {sorted(SPACES)}", field="policy"
    )


def default_knobs(policy: str) -> dict[str, float]:
    """The system's documented defaults, in this module's knob names."""
    from pace.sim import policies as pol

    if policy == "bytescheduler":
        part = pol.BYTESCHEDULER_PARTITION_BYTES
        return {
            "partition_bytes": float(part),
            "credit_units": float(max(1, pol.BYTESCHEDULER_CREDIT_BYTES // part)),
        }
    if policy == "horovod":
        return {
            "threshold_bytes": float(pol.HOROVOD_FUSION_THRESHOLD_BYTES),
            "cycle_us": float(pol.HOROVOD_CYCLE_TIME_US),
        }
    raise _unknown(policy)


def knob_policy(policy: str, knobs: Knobs) -> Any:
    """The simulator policy (``pace.sim.Policy``) of ``policy`` with ``knobs`` applied."""
    from pace.sim import POLICIES

    if policy == "bytescheduler":
        part = int(knobs["partition_bytes"])
        return POLICIES["bytescheduler"](
            partition_bytes=part, credit_bytes=int(knobs["credit_units"]) * part
        )
    if policy == "horovod":
        return POLICIES["horovod"](
            threshold_bytes=int(knobs["threshold_bytes"]), cycle_us=float(knobs["cycle_us"])
        )
    raise _unknown(policy)


def simulate_knobs(trace: Trace, policy: str, knobs: Knobs, *, options: Any = None) -> float:
    """Replayed iteration time of ``policy`` with ``knobs`` on ``trace``."""
    from pace.sim import SimOptions, simulate

    opts = options if options is not None else SimOptions()
    return float(simulate(trace, knob_policy(policy, knobs), options=opts).iteration_us)


@dataclass(frozen=True, kw_only=True, slots=True)
class TuneResult:
    """The best knobs found, their replayed time, and the default's for reference."""

    policy: str
    knobs: Mapping[str, float]
    iteration_us: float
    default_knobs: Mapping[str, float]
    default_us: float
    evaluations: int
    """Distinct knob settings simulated."""
    history: tuple[tuple[Mapping[str, float], float], ...] = field(default=(), compare=False)


def bayes_minimize(
    objective: Callable[[dict[str, float]], float],
    space: Sequence[Knob],
    *,
    x0: Mapping[str, float] | None = None,
    n_calls: int = 30,
    seed: int = 0,
) -> tuple[dict[str, float], float, list[tuple[dict[str, float], float]]]:
    """Minimise ``objective(knobs)`` with ``skopt.gp_minimize`` (GP surrogate, EI).

    Repeated points (integer knobs round to the same setting) are answered from a cache rather
    than re-simulated. Returns ``(best_knobs, best_value, history)``.
    """
    from skopt import gp_minimize
    from skopt.space import Integer, Real
    from threadpoolctl import threadpool_limits  # a scikit-learn dependency, so always there

    if n_calls < 1:
        raise ValueError(f"n_calls must be >= 1, got {n_calls}")
    dims: list[Any] = []
    for k in space:
        prior = "log-uniform" if k.log else "uniform"
        if k.integer:
            dims.append(Integer(int(k.low), int(k.high), prior=prior, name=k.name))
        else:
            dims.append(Real(k.low, k.high, prior=prior, name=k.name))
    cache: dict[tuple[float, ...], float] = {}
    history: list[tuple[dict[str, float], float]] = []

    def f(x: Sequence[Any]) -> float:
        knobs = {k.name: k.clip(float(v)) for k, v in zip(space, x, strict=True)}
        key = tuple(knobs.values())
        if key not in cache:
            value = float(objective(knobs))
            cache[key] = value
            history.append((knobs, value))
        return cache[key]

    start = None
    if x0 is not None:
        start = [[int(k.clip(x0[k.name])) if k.integer else k.clip(x0[k.name]) for k in space]]
    n_initial = max(1, min(8, n_calls // 3))
    # One BLAS thread: the GP fits are tiny matrices, and OpenBLAS's thread pool on a shared
    # 2-core machine made them ~10x slower (measured: 28 s vs 1.9 s for 20 calls).
    with warnings.catch_warnings(), threadpool_limits(limits=1):
        # skopt warns when it proposes an already-evaluated point; the cache answers it.
        warnings.simplefilter("ignore", UserWarning)
        gp_minimize(
            f,
            dims,
            x0=start,
            n_calls=max(n_calls, (1 if start else 0) + n_initial),
            n_initial_points=n_initial,
            acq_func="EI",
            acq_optimizer="sampling",
            n_points=2000,
            random_state=seed,
        )
    best_knobs, best_value = min(history, key=lambda kv: kv[1])
    return dict(best_knobs), best_value, history


def tune(
    trace: Trace,
    policy: str,
    *,
    n_calls: int = 30,
    seed: int = 0,
    options: Any = None,
    space: Sequence[Knob] | None = None,
) -> TuneResult:
    """Best-tuned knobs of ``policy`` (``bytescheduler`` or ``horovod``) on ``trace``.

    ``options`` are ``pace.sim.SimOptions`` passed to every replay (e.g. ``one_compute_stream``).
    """
    if policy not in SPACES:
        raise _unknown(policy)
    dims = tuple(space) if space is not None else SPACES[policy]
    defaults = default_knobs(policy)
    default_us = simulate_knobs(trace, policy, defaults, options=options)

    def objective(knobs: dict[str, float]) -> float:
        return math.log(max(simulate_knobs(trace, policy, knobs, options=options), 1e-12))

    best, best_log, history = bayes_minimize(
        objective, dims, x0=defaults, n_calls=n_calls, seed=seed
    )
    best_us = math.exp(best_log)
    if default_us <= best_us:
        # The default may lie outside the space (then x0 was clipped): keep it if better.
        best, best_us = dict(defaults), default_us
    return TuneResult(
        policy=policy,
        knobs=best,
        iteration_us=best_us,
        default_knobs=defaults,
        default_us=default_us,
        evaluations=len(history),
        history=tuple((k, math.exp(v)) for k, v in history),
    )
