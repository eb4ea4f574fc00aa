"""A simulated drift scenario: the whole drift loop against the simulator as the "real" cluster.

Each iteration the world is the base trace with the link's per-byte cost scaled by the current
bandwidth factor, and with jitter: per-iteration factors on forward compute, backward compute and
communication, plus rare slow steps. Every system replays its current plan on that iteration's
world with ``pace.sim.simulate``; what a monitor would record (iteration time, compute spans,
gradient-ready times, unit durations on an idle link) feeds the same trigger and estimator for
every adaptive system, so the comparison is on equal footing:

* ``pace-replanned``: compiled once, then re-estimate + recompile (``pace.compiler``) on trigger;
* ``pace-static``: compiled once for the base trace, never changed;
* ``bytescheduler-autobyte``: ByteScheduler BO-tuned at start, re-tuned by BO on the re-estimated
  trace on trigger (AutoByte's loop, with BO in place of its meta-network);
* ``bytescheduler-bo``: BO-tuned at start, then fixed (ByteScheduler as published);
* ``bytescheduler-default``: its documented all-reduce defaults.

A new plan takes effect ``replan_delay`` iterations after the trigger fires (compile time, in
iterations, fixed so that results do not depend on this machine's load), then at the next sync
point of ``SwitchProtocol`` plus its lag — exactly when the multi-rank protocol would switch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pace.drift.estimate import (
    EstimateOptions,
    IterationStats,
    ObservedStats,
    phase_scaled_ops,
    trace_spans,
)
from pace.drift.replan import DriftController, JitterPredictor, Replanner
from pace.drift.trigger import TriggerOptions
from pace.ir import Schedule, Trace

__all__ = [
    "SYSTEMS",
    "ScenarioOptions",
    "ScenarioResult",
    "SystemRun",
    "balance_compute",
    "run_scenario",
]

P = TypeVar("P")

SYSTEMS: tuple[str, ...] = (
    "pace-replanned",
    "pace-static",
    "bytescheduler-autobyte",
    "bytescheduler-bo",
    "bytescheduler-default",
)


def balance_compute(trace: Trace, ratio: float) -> tuple[Trace, float]:
    """Scale every op so compute (backward + forward span) = ``ratio`` x total all-reduce time.

    Traces profiled on a CPU are so compute-bound that no communication schedule matters; this
    gives a GPU-like balance. Returns the scaled trace and the scale factor.
    """
    if not (math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"ratio must be a positive number, got {ratio!r}")
    spans = trace_spans(trace)
    compute = spans.backward_us + spans.forward_us
    if compute <= 0:
        raise ValueError("the trace has no compute to scale")
    scale = ratio * trace.comm.cost_us(trace.total_bytes) / compute
    # The compiler's compute what-if is the one place op durations are rescaled.
    from pace.compiler import apply_what_if

    return apply_what_if(trace, compute_speedup=1.0 / scale), scale


@dataclass(frozen=True, kw_only=True, slots=True)
class ScenarioOptions:
    iterations: int = 300
    bandwidth_steps: tuple[tuple[int, float], ...] = ((0, 1.0), (100, 0.5), (200, 1.0))
    """``(first iteration, bandwidth factor)``: 0.5 = the link runs at half speed."""
    compute_jitter: float = 0.02
    """Standard deviation of the per-iteration forward/backward duration factors."""
    comm_jitter: float = 0.03
    """Standard deviation of the per-iteration communication cost factor."""
    slow_step_prob: float = 0.02
    """Probability that an iteration is a slow step (GC pause, preemption)..."""
    slow_step_factor: float = 1.3
    """...that takes this much longer."""
    seed: int = 0
    replan_delay: int = 2
    """Iterations between the trigger firing and the new plan being ready on rank 0."""
    sync_every: int = 5
    lag: int = 1
    tune_calls: int = 20
    """BO evaluations per (re)tune of ByteScheduler."""
    trigger: TriggerOptions = field(default_factory=TriggerOptions)
    max_unit_samples: int = 256
    """Unit durations recorded per iteration (a stride over the units beyond that)."""
    robust_samples: int = 12
    """Jittered worlds the adaptive systems average their switch predictions over
    (``JitterPredictor``, with this scenario's jitter levels); 1 = noise-free replay only."""

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")
        if not self.bandwidth_steps or self.bandwidth_steps[0][0] != 0:
            raise ValueError("bandwidth_steps must start at iteration 0")
        if any(f <= 0 for _, f in self.bandwidth_steps):
            raise ValueError("bandwidth factors must be > 0")
        for name in ("compute_jitter", "comm_jitter", "slow_step_prob"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    def bandwidth_at(self, iteration: int) -> float:
        factor = 1.0
        for start, f in self.bandwidth_steps:
            if iteration >= start:
                factor = f
        return factor


@dataclass(frozen=True, kw_only=True, slots=True)
class SystemRun:
    """One system's run: per-iteration times and what its drift loop did."""

    name: str
    iteration_us: tuple[float, ...]
    switches: tuple[int, ...] = ()
    """Iterations that first ran a new plan."""
    fired: tuple[int, ...] = ()
    """Iterations at which the trigger fired."""
    plan_seconds: tuple[float, ...] = ()
    """Wall time of each (re)compile or (re)tune on this machine."""

    def mean_us(self, start: int, stop: int) -> float:
        return statistics.fmean(self.iteration_us[start:stop])


@dataclass(frozen=True, kw_only=True, slots=True)
class ScenarioResult:
    options: ScenarioOptions
    runs: Mapping[str, SystemRun]

    def phases(self) -> list[tuple[int, int, float]]:
        """``(start, stop, bandwidth factor)`` of each constant-bandwidth phase."""
        steps = list(self.options.bandwidth_steps)
        out = []
        for i, (start, f) in enumerate(steps):
            stop = steps[i + 1][0] if i + 1 < len(steps) else self.options.iterations
            if start < stop:
                out.append((start, min(stop, self.options.iterations), f))
        return out


class _World:
    """The jittered 'real' iteration: one per iteration index, the same for every system."""

    def __init__(self, trace: Trace, opts: ScenarioOptions) -> None:
        self.base = trace
        self.opts = opts
        self.spans = trace_spans(trace)
        rng = random.Random(opts.seed)
        self.draws = [
            (
                max(0.5, rng.gauss(1.0, opts.compute_jitter)),
                max(0.5, rng.gauss(1.0, opts.compute_jitter)),
                max(0.5, rng.gauss(1.0, opts.comm_jitter)),
                opts.slow_step_factor if rng.random() < opts.slow_step_prob else 1.0,
            )
            for _ in range(opts.iterations)
        ]
        self._cache: dict[int, Trace] = {}

    def trace(self, it: int) -> Trace:
        got = self._cache.get(it)
        if got is not None:
            return got
        fw, bw, cm, _slow = self.draws[it]
        bw_factor = self.opts.bandwidth_at(it)
        base = self.base
        ops = phase_scaled_ops(base, forward_scale=fw, backward_scale=bw)
        comm = dataclasses.replace(
            base.comm,
            alpha_us=base.comm.alpha_us * cm,
            beta_us_per_byte=base.comm.beta_us_per_byte * cm / bw_factor,
        )
        got = dataclasses.replace(base, ops=ops, comm=comm)
        if len(self._cache) > 4:
            self._cache.pop(next(iter(self._cache)))
        self._cache[it] = got
        return got

    def observe(self, it: int, policy: Any) -> IterationStats:
        """Run ``policy`` in iteration ``it``'s world and record what a monitor would see."""
        from pace.sim import simulate

        world = self.trace(it)
        fw, bw, _cm, slow = self.draws[it]
        res = simulate(world, policy)
        units = res.units
        stride = max(1, math.ceil(len(units) / self.opts.max_unit_samples))
        samples = tuple((u.size_bytes, world.comm.cost_us(u.size_bytes)) for u in units[::stride])
        return IterationStats(
            iteration=it,
            iteration_us=res.iteration_us * slow,
            backward_us=self.spans.backward_us * bw,
            forward_us=self.spans.forward_us * fw,
            grad_ready_us={n: r * bw for n, r in self.spans.ready_us.items()},
            unit_samples=samples,
        )


class _Recent:
    """The last iterations a system's monitor recorded (what ``Monitor.snapshot`` returns)."""

    def __init__(self) -> None:
        self.items: deque[IterationStats] = deque(maxlen=64)

    def observed(self, n: int) -> ObservedStats:
        return ObservedStats(iterations=tuple(self.items)[-n:])


class _Adaptive(Generic[P]):
    """One system: a plan, maybe a controller, and the protocol's switch timing."""

    def __init__(
        self,
        *,
        name: str,
        plan: P,
        policy_of: Callable[[P], Any],
        controller: DriftController[P] | None,
        opts: ScenarioOptions,
        recent: _Recent,
        plan_seconds: list[float],
    ) -> None:
        self.name = name
        self.plan = plan
        self.policy_of = policy_of
        self.controller = controller
        self.opts = opts
        self.recent = recent
        self.times: list[float] = []
        self.switches: list[int] = []
        self.pending: list[tuple[int, P]] = []
        self.plan_seconds = plan_seconds

    def effective_iteration(self, fired_at: int) -> int:
        ready = fired_at + self.opts.replan_delay
        boundary = -(-ready // self.opts.sync_every) * self.opts.sync_every
        return boundary + self.opts.lag

    def run_iteration(self, world: _World, it: int) -> None:
        while self.pending and self.pending[0][0] <= it:
            _, self.plan = self.pending.pop(0)
            self.switches.append(it)
        stats = world.observe(it, self.policy_of(self.plan))
        self.recent.items.append(stats)
        self.times.append(stats.iteration_us)
        if self.controller is not None:
            new = self.controller.step(stats.iteration_us)
            if new is not None:
                self.pending.append((self.effective_iteration(it), new))

    def result(self) -> SystemRun:
        fired: tuple[int, ...] = ()
        if self.controller is not None:
            fired = tuple(e.iteration for e in self.controller.events if e.kind == "fired")
        return SystemRun(
            name=self.name,
            iteration_us=tuple(self.times),
            switches=tuple(self.switches),
            fired=fired,
            plan_seconds=tuple(self.plan_seconds),
        )


def run_scenario(
    trace: Trace,
    options: ScenarioOptions | None = None,
    *,
    systems: Sequence[str] = SYSTEMS,
    progress: Callable[[int], None] | None = None,
) -> ScenarioResult:
    """Run every system in ``systems`` through the same jittered drift scenario."""
    from benchmarks.drift_tune import default_knobs, knob_policy, simulate_knobs, tune
    from pace.compiler import compile_trace
    from pace.drift.replan import compile_schedule, predict_schedule
    from pace.sim import schedule_policy

    opts = options if options is not None else ScenarioOptions()
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; known: {list(SYSTEMS)}")
    world = _World(trace, opts)
    est_opts = EstimateOptions(window=opts.trigger.consecutive)
    runners: list[_Adaptive[Any]] = []

    def timed(fn: Callable[[Trace], Any], log: list[float]) -> Callable[[Trace], Any]:
        def wrapped(t: Trace) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(t)
            finally:
                log.append(time.perf_counter() - t0)

        return wrapped

    def robust(predict: Callable[[Trace, Any], float]) -> Callable[[Trace, Any], float]:
        # The monitor would measure this dispersion; the scenario knows it exactly.
        return JitterPredictor(
            predict,
            compute_sd=opts.compute_jitter,
            comm_sd=opts.comm_jitter,
            samples=opts.robust_samples,
            seed=opts.seed,
        )

    def controller(
        plan: P,
        predicted_us: float,
        compile_fn: Callable[[Trace], P],
        predict_fn: Callable[[Trace, P], float],
        recent: _Recent,
    ) -> DriftController[P]:
        # Synchronous: the simulated run compiles at once, as if it took no iterations.
        return DriftController(
            trace=trace,
            plan=plan,
            predicted_iteration_us=predicted_us,
            replanner=Replanner(compile_fn=compile_fn, predict_fn=predict_fn),
            observed=recent.observed,
            trigger_options=opts.trigger,
            estimate_options=est_opts,
            synchronous=True,
        )

    need_pace = {"pace-replanned", "pace-static"} & set(systems)
    base_schedule: Schedule | None = None
    if need_pace:
        base_schedule = compile_trace(trace, baselines=False).schedule
    for name in ("pace-replanned", "pace-static"):
        if name not in systems:
            continue
        assert base_schedule is not None
        ctl: DriftController[Schedule] | None = None
        seconds: list[float] = []
        recent = _Recent()
        if name == "pace-replanned":
            ctl = controller(
                base_schedule,
                base_schedule.predicted_iteration_us,
                timed(compile_schedule, seconds),
                robust(predict_schedule),
                recent,
            )
        runners.append(
            _Adaptive(
                name=name,
                plan=base_schedule,
                # The world replays the plan as the runtime issues it: strictly in order.
                policy_of=functools.partial(schedule_policy, in_order=True),
                controller=ctl,
                opts=opts,
                recent=recent,
                plan_seconds=seconds,
            )
        )

    def bs_policy(knobs: Mapping[str, float]) -> Any:
        return knob_policy("bytescheduler", knobs)

    bo_knobs: Mapping[str, float] | None = None
    if {"bytescheduler-autobyte", "bytescheduler-bo"} & set(systems):
        bo_knobs = tune(trace, "bytescheduler", n_calls=opts.tune_calls, seed=opts.seed).knobs
    for name in ("bytescheduler-autobyte", "bytescheduler-bo", "bytescheduler-default"):
        if name not in systems:
            continue
        knobs = default_knobs("bytescheduler") if name == "bytescheduler-default" else bo_knobs
        assert knobs is not None
        kctl: DriftController[Mapping[str, float]] | None = None
        seconds_bs: list[float] = []
        recent = _Recent()
        if name == "bytescheduler-autobyte":

            def retune(t: Trace) -> Mapping[str, float]:
                return tune(t, "bytescheduler", n_calls=opts.tune_calls, seed=opts.seed).knobs

            def predict_knobs(t: Trace, k: Mapping[str, float]) -> float:
                return simulate_knobs(t, "bytescheduler", k)

            kctl = controller(
                knobs,
                simulate_knobs(trace, "bytescheduler", knobs),
                timed(retune, seconds_bs),
                robust(predict_knobs),
                recent,
            )
        runners.append(
            _Adaptive(
                name=name,
                plan=knobs,
                policy_of=bs_policy,
                controller=kctl,
                opts=opts,
                recent=recent,
                plan_seconds=seconds_bs,
            )
        )

    try:
        for it in range(opts.iterations):
            for r in runners:
                r.run_iteration(world, it)
            if progress is not None:
                progress(it)
    finally:
        for r in runners:
            if r.controller is not None:
                r.controller.replanner.close()
    return ScenarioResult(options=opts, runs={r.name: r.result() for r in runners})
