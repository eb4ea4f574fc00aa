"""The drift loop the runtime runs for ``wrap(..., drift=True)``: one switch for the user.

Per rank, at every iteration boundary (``step()``, or the end of ``backward()`` in the sync
mode), the runtime calls :meth:`DriftLoop.boundary`. The loop

* closes the iteration in its :class:`~pace.drift.monitor.Monitor`, which the runtime feeds with
  the backward/forward spans, gradient-ready times and unit channel times;
* on rank 0, steps the :class:`~pace.drift.replan.DriftController` with the observed iteration
  time: the trigger fires after ``consecutive`` iterations outside the band, the window is
  re-estimated, a background thread recompiles, and a candidate is accepted only with the
  predicted gain the trigger asks for;
* every ``sync_every`` iterations calls the :class:`~pace.drift.replan.SwitchProtocol`'s one
  broadcast from rank 0, so every rank installs an accepted schedule before the same iteration.

Every decision is logged on the ``pace.drift`` logger (one line each: fired, switched, kept,
failed) and, with ``stats_dir``, the monitor's window is written as ``stats.json`` when the
trigger fires (``pace recompile TRACE --observed FILE`` replays the decision offline).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pace.checks import require_int
from pace.drift.estimate import EstimateOptions
from pace.drift.monitor import Monitor
from pace.drift.replan import (
    DriftController,
    DriftEvent,
    Replanner,
    SwitchProtocol,
    compile_schedule,
    predict_schedule,
)
from pace.drift.trigger import TriggerOptions
from pace.ir import Schedule, Trace

__all__ = ["DriftLoop", "DriftOptions", "schedule_trace"]

log = logging.getLogger("pace.drift")


@dataclass(frozen=True, kw_only=True, slots=True)
class DriftOptions:
    """``wrap(..., drift=DriftOptions(...))``; ``drift=True`` takes these defaults.

    ``sync_every``: iterations between the ranks' agreement points (one small broadcast each);
    ``lag``: iterations from an agreement point to the switch (>= 1). ``trigger``: deviation
    band, streak length, gain threshold and cool-down (AutoByte's defaults). ``estimate``: the
    window the re-estimate takes its medians over. ``window``: iterations the monitor keeps.
    ``stats_dir``: where rank 0 writes ``stats-<iteration>.json`` when the trigger fires.
    """

    sync_every: int = 10
    lag: int = 2
    trigger: TriggerOptions = dataclasses.field(default_factory=TriggerOptions)
    estimate: EstimateOptions = dataclasses.field(default_factory=EstimateOptions)
    window: int = 64
    stats_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("sync_every", "lag", "window"):
            require_int(getattr(self, name), where=f"drift.{name}", minimum=1)


def schedule_trace(trace: Trace, schedule: Schedule) -> Trace:
    """The trace as ``schedule`` was compiled for it: its cost model, compute what-if and mode
    (what its ``predicted_iteration_us`` replays)."""
    from pace.compiler import apply_what_if

    return apply_what_if(
        dataclasses.replace(trace, comm=schedule.cost_model),
        compute_speedup=schedule.compute_speedup,
        mode=schedule.mode,
    )


class DriftLoop:
    """One rank's side of drift re-planning (see the module docstring)."""

    def __init__(
        self,
        *,
        trace: Trace,
        schedule: Schedule,
        param_names: tuple[str, ...],
        rank: int,
        broadcast_bytes: Callable[[bytes | None], bytes],
        options: DriftOptions,
    ) -> None:
        self.options = options
        self.rank = rank
        self.monitor = Monitor(param_names, capacity=options.window)
        self.protocol = SwitchProtocol(
            rank=rank,
            broadcast_bytes=broadcast_bytes,
            sync_every=options.sync_every,
            lag=options.lag,
        )
        self.controller: DriftController[Schedule] | None = None
        if rank == 0:
            base = schedule_trace(trace, schedule)
            mode = schedule.mode

            def compile_fn(t: Trace) -> Schedule:
                # The re-estimated trace is already on the schedule's loop (sync_trace is
                # idempotent), so the new schedule keeps the runtime's mode.
                return compile_schedule(t, mode=mode)

            self.controller = DriftController(
                trace=base,
                plan=schedule,
                predicted_iteration_us=schedule.predicted_iteration_us,
                replanner=Replanner(compile_fn=compile_fn, predict_fn=predict_schedule),
                observed=lambda n: self.monitor.snapshot(last=n),
                trigger_options=options.trigger,
                estimate_options=options.estimate,
            )
        self._events_logged = 0
        self._started = False
        self.switched_at: list[int] = []
        """Iterations (the first run with the new schedule) at which this rank switched."""
        self.decisions: list[tuple[int, DriftEvent]] = []
        """Rank 0: each controller event with the runtime's iteration it happened at."""

    # -- monitor feed (training thread, from the runtime's hooks) --------------------------

    def boundary(self, iteration: int, now_us: float) -> Schedule | None:
        """Iteration ``iteration`` is closed on this rank; maybe the schedule of the next one.

        Iteration times run from one boundary to the next, so the first boundary only starts
        the clock (the first iteration also carries start-up costs).
        """
        if self._started:
            iteration_us = self.monitor.on_iteration_end(now_us)
        else:
            self._started = True
            self.monitor.on_iteration_start(now_us)
            iteration_us = math.nan
        ctl = self.controller
        if ctl is not None and math.isfinite(iteration_us):
            accepted = ctl.step(iteration_us)
            self._log_events(ctl, iteration)
            if accepted is not None:
                self.protocol.propose(accepted)
        new = self.protocol.boundary(iteration)
        if new is not None:
            self.switched_at.append(iteration + 1)
            log.info(
                "pace.drift: rank %d switches to the new schedule at iteration %d",
                self.rank,
                iteration + 1,
            )
        return new

    def _log_events(self, ctl: DriftController[Schedule], iteration: int) -> None:
        for event in ctl.events[self._events_logged :]:
            self.decisions.append((iteration, event))
            self._log(event, ctl, iteration)
        self._events_logged = len(ctl.events)

    def _log(self, event: DriftEvent, ctl: DriftController[Schedule], iteration: int) -> None:
        if event.kind == "fired":
            est = ctl.estimated_trace.comm
            log.info(
                "pace.drift: iteration %d: drift fired (median %.1f ms over the streak, "
                "expected %.1f ms); re-estimated link: alpha %.0f us, %s; recompiling",
                iteration,
                ctl.observed_us / 1e3,
                ctl.trigger.reference_us / 1e3,
                est.alpha_us,
                f"{8e-3 / est.beta_us_per_byte:.3f} Gbit/s"
                if est.beta_us_per_byte > 0
                else "no per-byte cost measurable",
            )
            if self.options.stats_dir is not None:
                path = Path(self.options.stats_dir) / f"stats-{iteration}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                self.monitor.dump(str(path))
        elif event.kind in ("switched", "kept"):
            gain = 1.0 - event.candidate_us / event.current_us if event.current_us > 0 else 0.0
            log.info(
                "pace.drift: iteration %d: %s: current schedule %.1f ms, recompiled %.1f ms "
                "predicted (gain %+.1f%%, threshold %.1f%%)%s",
                iteration,
                "switch" if event.kind == "switched" else "kept the current schedule",
                event.current_us / 1e3,
                event.candidate_us / 1e3,
                100 * gain,
                100 * ctl.trigger.options.gain_threshold,
                f"; every rank switches within {self.options.sync_every + self.options.lag} "
                "iterations"
                if event.kind == "switched"
                else "",
            )
        else:
            log.warning("pace.drift: iteration %d: re-plan failed: %s", iteration, event.detail)

    def close(self) -> None:
        if self.controller is not None:
            self.controller.replanner.close()


def now_us() -> float:
    """The clock of the runtime's hooks (``time.perf_counter`` in microseconds)."""
    return time.perf_counter() * 1e6
