"""Recompile in the background and switch schedules at the same iteration on every rank.

Three pieces, each usable alone:

* ``Replanner``: runs ``compile_fn(trace)`` on a one-thread pool (one compile at a time), then
  predicts the candidate and the current plan on the re-estimated trace. A compile that raises
  leaves the current plan in place; ``poll`` re-raises the failure as ``ReplanError`` so the
  caller decides (the controller abandons the re-estimation and cools down).
* ``DriftController``: rank 0's loop glue: trigger -> estimate -> replan -> gain check. Generic
  in the plan type, so the same trigger and estimate drive pace's schedules and the AutoByte-style
  knob retuning of the ByteScheduler baseline in the drift benchmark.
* ``SwitchProtocol``: the agreement. Collectives must be issued in the same order on every rank,
  so a schedule may change only at an iteration boundary that all ranks agree on, without any
  negotiation in the hot path. Every ``sync_every`` iterations all ranks call one broadcast from
  rank 0 (an empty message when there is no news, so the collective is always matched); a
  non-empty message carries the serialized schedule and ``switch_at`` = the boundary iteration +
  ``lag``. Every rank installs it before iteration ``switch_at``. The broadcast is backend-agnostic
  (``broadcast_bytes``: Horovod's ``broadcast_object``, torch's ``broadcast_object_list``, or
  threads in the tests).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pace.checks import require_int
from pace.drift.estimate import (
    EstimateOptions,
    ObservedStats,
    apply_estimate,
    estimate,
)
from pace.drift.trigger import DriftTrigger, TriggerOptions
from pace.errors import InputError, PaceError
from pace.ir import Schedule, ScheduleMode, Trace
from pace.jitter import JitterModel
from pace.options import DriftEventKind

__all__ = [
    "SWITCH_FORMAT",
    "DriftController",
    "DriftEvent",
    "JitterPredictor",
    "Recompiled",
    "ReplanError",
    "Replanner",
    "SwitchProtocol",
    "compile_schedule",
    "decode_switch",
    "encode_switch",
    "predict_schedule",
]

P = TypeVar("P")

SWITCH_FORMAT = "pace.switch"


class ReplanError(PaceError):
    """A background recompile failed; the current plan stays in place."""


def compile_schedule(trace: Trace, *, mode: ScheduleMode = "overlap") -> Schedule:
    """Default compile: the full pipeline of ``pace.compiler`` on the re-estimated trace."""
    from pace.compiler import compile_trace

    # Baselines are for reports; a re-plan needs only the schedule (and is then faster).
    # A running replay cannot switch to the framework's own path: the units only (framework=False).
    return compile_trace(trace, baselines=False, mode=mode, framework=False).schedule


def predict_schedule(trace: Trace, schedule: Schedule) -> float:
    """Default prediction: replay ``schedule`` on ``trace`` as the runtime issues it, strictly
    in priority order (``in_order=True``).

    A schedule is numbered in its own replay's start order only on the trace it was compiled
    for; on a re-estimated or jittered trace a unit may be ready before one with a smaller
    priority, and the runtime then waits where the contract's work-conserving replay would not
    (docs/schedule-format.md, "Priorities as the runtime reads them").
    """
    from pace.sim import runtime_replay_us

    return runtime_replay_us(trace, schedule)


class JitterPredictor(Generic[P]):
    """Mean prediction over jittered worlds of the trace (a robust ``predict_fn``).

    An optimal preemptive schedule is timed: its partitions end where later, more urgent
    gradients are released. A few percent of jitter moves the releases, a planned preemption
    misses, and a large unit blocks the urgent one (measured: a 20-layer trace flips between
    43 ms and 48 ms per iteration with 0.5% compute jitter). Judging a switch on the noise-free
    replay then adopts fragile schedules; averaging over the worlds of the project's one jitter
    model (``pace.jitter.JitterModel``: here one factor per phase with log-sd ``compute_sd`` and
    one on the link with ``comm_sd`` — the dispersion the monitor observes — plus the nominal
    world) compares plans as they will actually run, with the objective the compiler's robust
    selection uses. Deterministic (fixed seed).
    """

    def __init__(
        self,
        predict: Callable[[Trace, P], float],
        *,
        compute_sd: float,
        comm_sd: float,
        samples: int = 12,
        seed: int = 0,
    ) -> None:
        self._predict = predict
        self.model = JitterModel(
            phase_sd=compute_sd, comm_sd=comm_sd, samples=samples, seed=seed, nominal_first=True
        )

    def worlds(self, trace: Trace) -> list[Trace]:
        return self.model.traces(trace)

    def __call__(self, trace: Trace, plan: P) -> float:
        return self.model.mean(trace, lambda world: self._predict(world, plan))


@dataclass(frozen=True, kw_only=True, slots=True)
class Recompiled(Generic[P]):
    """A finished recompile: the new plan and both predictions on the re-estimated trace."""

    plan: P
    trace: Trace
    """The re-estimated trace it was compiled for."""
    current_us: float
    """The plan that was running, replayed on ``trace``."""
    candidate_us: float
    compile_seconds: float


class Replanner(Generic[P]):
    """Background recompiles, one at a time.

    ``compile_fn(trace) -> plan`` and ``predict_fn(trace, plan) -> us`` run on the pool thread,
    so the training thread only pays for ``submit`` and ``poll`` (O(1)).
    """

    def __init__(
        self,
        *,
        compile_fn: Callable[[Trace], P],
        predict_fn: Callable[[Trace, P], float],
        executor: ThreadPoolExecutor | None = None,
    ) -> None:
        self._compile = compile_fn
        self._predict = predict_fn
        self._own_executor = executor is None
        self._executor = (
            executor
            if executor is not None
            else ThreadPoolExecutor(max_workers=1, thread_name_prefix="pace-replan")
        )
        self._future: Future[Recompiled[P]] | None = None
        self.submitted = 0
        self.failures = 0

    @property
    def busy(self) -> bool:
        """A compile has been submitted and not yet collected by ``poll``."""
        return self._future is not None

    def submit(self, trace: Trace, current: P) -> bool:
        """Start compiling for ``trace``; False (and nothing started) if one is still running."""
        if self._future is not None:
            return False
        self.submitted += 1
        self._future = self._executor.submit(self._run, trace, current)
        return True

    def _run(self, trace: Trace, current: P) -> Recompiled[P]:
        t0 = time.perf_counter()
        plan = self._compile(trace)
        seconds = time.perf_counter() - t0
        return Recompiled(
            plan=plan,
            trace=trace,
            current_us=float(self._predict(trace, current)),
            candidate_us=float(self._predict(trace, plan)),
            compile_seconds=seconds,
        )

    def poll(self) -> Recompiled[P] | None:
        """The finished candidate, or None if none finished; raises ``ReplanError`` on failure."""
        fut = self._future
        if fut is None or not fut.done():
            return None
        return self._collect(fut)

    def wait(self, timeout_s: float | None = None) -> Recompiled[P] | None:
        """Block until the running compile finishes (None if none is running or on time-out)."""
        fut = self._future
        if fut is None:
            return None
        try:
            fut.result(timeout=timeout_s)
        except TimeoutError:
            return None
        except Exception:  # collected and re-raised as ReplanError just below
            pass
        return self._collect(fut)

    def _collect(self, fut: Future[Recompiled[P]]) -> Recompiled[P]:
        self._future = None
        try:
            return fut.result()
        except Exception as exc:
            self.failures += 1
            raise ReplanError(f"recompile failed: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        """Stop the pool thread (waits for a running compile)."""
        if self._own_executor:
            self._executor.shutdown(wait=True)

    def __enter__(self) -> Replanner[P]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, kw_only=True, slots=True)
class DriftEvent:
    """One thing the controller did, for logs, reports and tests."""

    iteration: int
    kind: DriftEventKind
    """``fired``, ``switched``, ``kept`` (gain too small), ``failed`` (compile raised)."""
    current_us: float = 0.0
    candidate_us: float = 0.0
    detail: str = ""


class DriftController(Generic[P]):
    """Rank 0's drift loop: call ``step`` once per iteration with the observed time.

    ``observed(n)`` returns the last ``n`` iterations' statistics (e.g. ``Monitor.snapshot``);
    it is called only when the trigger fires. ``step`` returns a new plan when one has been
    accepted (predicted gain above the trigger's threshold), else None. The caller then
    distributes it (``SwitchProtocol.propose``) and switches at the agreed boundary.

    Calibration: the simulator's prediction of a plan can be biased against reality (jitter
    makes a timed schedule's preemption points miss, the replay model is ideal compute, ...).
    If the trigger's band were centred on the raw prediction, a biased model would fire every
    cool-down forever. So after each re-estimation the band is centred on the *calibrated*
    prediction ``predicted * (observed median / current plan's prediction on the estimate)``:
    the observed operating point if the plan is kept, the candidate scaled by the same bias if
    it is adopted. ``calibrate=False`` uses raw predictions.
    """

    def __init__(
        self,
        *,
        trace: Trace,
        plan: P,
        predicted_iteration_us: float,
        replanner: Replanner[P],
        observed: Callable[[int], ObservedStats],
        trigger_options: TriggerOptions | None = None,
        estimate_options: EstimateOptions | None = None,
        synchronous: bool = False,
        calibrate: bool = True,
    ) -> None:
        self.base_trace = trace
        self.plan = plan
        self.trigger = DriftTrigger(
            predicted_iteration_us=predicted_iteration_us, options=trigger_options
        )
        self.replanner = replanner
        self._observed = observed
        self._estimate_options = estimate_options
        self._synchronous = synchronous
        self._calibrate = calibrate
        self._observed_us = 0.0
        self.events: list[DriftEvent] = []
        self.estimated_trace: Trace = trace
        self._iteration = -1

    @property
    def observed_us(self) -> float:
        """Median observed iteration time of the last re-estimation (0 before any)."""
        return self._observed_us

    def step(self, iteration_us: float) -> P | None:
        self._iteration += 1
        it = self._iteration
        if self.trigger.observe(iteration_us):
            self.events.append(DriftEvent(iteration=it, kind="fired"))
            k = self.trigger.options.consecutive
            window = self._estimate_options.window if self._estimate_options else k
            # Only the streak that fired is known to be in the new regime; a longer window
            # would let the median see the old one.
            stats = self._observed(min(k, window))
            try:
                # Compare with the replay of what ran (a Schedule; simulations drive other
                # plans), so the interference that schedule already causes is not drift.
                running = self.plan if isinstance(self.plan, Schedule) else None
                est = estimate(self.base_trace, stats, self._estimate_options, running=running)
                new_trace = apply_estimate(self.base_trace, est)
            except InputError as exc:
                self.trigger.abandon()
                self.events.append(DriftEvent(iteration=it, kind="failed", detail=str(exc)))
                return None
            self.estimated_trace = new_trace
            self._observed_us = est.observed_iteration_us
            self.replanner.submit(new_trace, self.plan)
            if self._synchronous:
                # Simulations and the offline path: compile now, as if it took no iterations.
                return self._poll(it, wait=True)
        return self._poll(it, wait=False)

    def _poll(self, it: int, *, wait: bool) -> P | None:
        try:
            cand = self.replanner.wait() if wait else self.replanner.poll()
        except ReplanError as exc:
            self.trigger.abandon()
            self.events.append(DriftEvent(iteration=it, kind="failed", detail=str(exc)))
            return None
        if cand is None:
            return None
        bias = 1.0
        if self._calibrate and self._observed_us > 0 and cand.current_us > 0:
            bias = self._observed_us / cand.current_us
        switch = self.trigger.should_switch(
            current_us=cand.current_us, candidate_us=cand.candidate_us
        )
        if switch:
            self.plan = cand.plan
        # The band moves to the prediction of whichever schedule runs from now on.
        running_us = cand.candidate_us if switch else cand.current_us
        self.trigger.resolve(reference_us=running_us * bias)
        self.events.append(
            DriftEvent(
                iteration=it,
                kind="switched" if switch else "kept",
                current_us=cand.current_us,
                candidate_us=cand.candidate_us,
            )
        )
        return cand.plan if switch else None


# ---------------------------------------------------------------------------------------------
# Switching protocol


def encode_switch(schedule: Schedule, switch_at: int) -> bytes:
    """The broadcast message: ``switch_at`` and the schedule in its file format (v1)."""
    from pace.io import schedule_to_dict

    msg: dict[str, Any] = {
        "format": SWITCH_FORMAT,
        "version": 1,
        "switch_at": switch_at,
        "schedule": schedule_to_dict(schedule),
    }
    return json.dumps(msg, allow_nan=False, separators=(",", ":")).encode("utf-8")


def decode_switch(payload: bytes) -> tuple[int, Schedule]:
    """Inverse of ``encode_switch``; raises ``InputError`` on a malformed message."""
    from pace.io import schedule_from_dict

    where = "switch message"
    try:
        msg = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not JSON: {exc}", where=where) from None
    if not isinstance(msg, dict) or msg.get("format") != SWITCH_FORMAT or msg.get("version") != 1:
        raise InputError(f"expected {SWITCH_FORMAT} version 1", where=where, field="format")
    switch_at = require_int(msg.get("switch_at"), where=where, field="switch_at")
    return switch_at, schedule_from_dict(msg.get("schedule"), where=where)


class SwitchProtocol:
    """Agree on the iteration at which every rank switches to a new schedule.

    Call ``boundary(iteration)`` on every rank after iteration ``iteration`` finished (after
    ``synchronize``: no unit of that iteration may be outstanding) and before the next one
    issues any collective. It returns the schedule to use from the next iteration on, or None
    to keep the current one. Rank ``root`` calls ``propose`` (from any thread) when the
    controller accepted a schedule.
    """

    def __init__(
        self,
        *,
        rank: int,
        broadcast_bytes: Callable[[bytes | None], bytes],
        sync_every: int = 10,
        lag: int = 1,
        root: int = 0,
    ) -> None:
        if sync_every < 1:
            raise InputError(f"must be >= 1, got {sync_every!r}", field="sync_every")
        if lag < 1:
            raise InputError(f"must be >= 1, got {lag!r}", field="lag")
        self.rank = rank
        self.root = root
        self._broadcast = broadcast_bytes
        self.sync_every = sync_every
        self.lag = lag
        self._lock = threading.Lock()
        self._proposal: Schedule | None = None
        self._pending: tuple[int, Schedule] | None = None
        self.switches: list[int] = []
        """Iterations (first iteration run with the new schedule) at which this rank switched."""

    def propose(self, schedule: Schedule) -> None:
        """Queue ``schedule`` for the next sync point (root only; a newer proposal replaces it)."""
        if self.rank != self.root:
            raise InputError(
                f"only rank {self.root} proposes schedules (this is rank {self.rank})",
                field="rank",
            )
        with self._lock:
            self._proposal = schedule

    def boundary(self, iteration: int) -> Schedule | None:
        """Iteration ``iteration`` is done on this rank; maybe sync; maybe switch now."""
        if iteration % self.sync_every == 0:
            payload: bytes | None = None
            if self.rank == self.root:
                with self._lock:
                    proposal, self._proposal = self._proposal, None
                payload = b"" if proposal is None else encode_switch(proposal, iteration + self.lag)
            received = self._broadcast(payload)
            if received:
                self._pending = decode_switch(received)
        pending = self._pending
        if pending is not None and pending[0] == iteration + 1:
            self._pending = None
            self.switches.append(pending[0])
            return pending[1]
        return None
