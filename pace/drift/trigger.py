"""When to re-estimate and when to switch: a hysteresis trigger (AutoByte's optimisation trigger).

Two thresholds, as in AutoByte (seed 003, Sec. III): the *deviation* threshold (10%) starts a
re-estimation when the observed iteration time has left the prediction's band for ``consecutive``
iterations in a row; the *gain* threshold (5%) admits a new schedule only if it is predicted to be
that much faster than the current one under the same (new) estimate.

No oscillation comes from three rules, each needed:

* a deviation must persist for ``consecutive`` iterations (a single slow step never fires);
* after a re-estimation the reference moves to the prediction under the *new* estimate whether or
  not the schedule changed, so a persistent step change is answered once, not every K iterations;
* a cool-down after each resolution ignores the transient while the estimate's window refills.

The trigger is a plain state machine over numbers: the runtime, the simulated drift benchmark and
the property tests drive it identically.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from pace.checks import require_number
from pace.errors import InputError

__all__ = ["DriftTrigger", "TriggerOptions", "TriggerState"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TriggerOptions:
    """Knobs of the hysteresis trigger; defaults are AutoByte's thresholds."""

    deviation_threshold: float = 0.10
    """Relative deviation |observed / predicted - 1| that counts as drift."""
    consecutive: int = 5
    """Iterations in a row outside the band before re-estimating (K)."""
    gain_threshold: float = 0.05
    """A new schedule is adopted only if ``(current - new) / current`` exceeds this."""
    cooldown_iterations: int = 20
    """Iterations after a resolution during which deviations are not counted."""

    def __post_init__(self) -> None:
        require_number(self.deviation_threshold, field="deviation_threshold", above=0)
        require_number(self.gain_threshold, field="gain_threshold", minimum=0)
        if self.consecutive < 1:
            raise InputError(f"must be >= 1, got {self.consecutive!r}", field="consecutive")
        if self.cooldown_iterations < 0:
            raise InputError(
                f"must be >= 0, got {self.cooldown_iterations!r}", field="cooldown_iterations"
            )


class TriggerState(enum.Enum):
    WATCHING = "watching"
    """Comparing observations with the reference prediction."""
    PENDING = "pending"
    """Fired; waiting for the re-estimation (and maybe a recompile) to be resolved."""
    COOLDOWN = "cooldown"
    """Resolved recently; deviations are not counted yet."""


class DriftTrigger:
    """Hysteresis trigger over per-iteration times.

    >>> trig = DriftTrigger(predicted_iteration_us=100.0, options=TriggerOptions(consecutive=2))
    >>> [trig.observe(t) for t in (104.0, 130.0, 95.0, 130.0, 131.0)]
    [False, False, False, False, True]
    >>> trig.should_switch(current_us=130.0, candidate_us=120.0)
    True
    >>> trig.resolve(reference_us=120.0)
    >>> trig.state
    <TriggerState.COOLDOWN: 'cooldown'>
    """

    def __init__(
        self, *, predicted_iteration_us: float, options: TriggerOptions | None = None
    ) -> None:
        _check_positive("predicted_iteration_us", predicted_iteration_us)
        self.options = options if options is not None else TriggerOptions()
        self.reference_us = float(predicted_iteration_us)
        self.state = TriggerState.WATCHING
        self._streak = 0
        self._cooldown_left = 0
        self.fired = 0
        """How many times the trigger has fired (for reports and tests)."""

    def deviation(self, iteration_us: float) -> float:
        """Relative deviation of one observation from the reference prediction."""
        return abs(iteration_us / self.reference_us - 1.0)

    def observe(self, iteration_us: float) -> bool:
        """Feed one iteration's time; True exactly when a re-estimation should start now.

        While a re-estimation is pending, or during the cool-down, it never fires.
        """
        if not math.isfinite(iteration_us) or iteration_us < 0:
            # A broken clock reading is not evidence of drift; it also breaks a streak, since the
            # streak means "K real observations in a row".
            self._streak = 0
            return False
        if self.state is TriggerState.PENDING:
            return False
        if self.state is TriggerState.COOLDOWN:
            self._cooldown_left -= 1
            if self._cooldown_left <= 0:
                self.state = TriggerState.WATCHING
            return False
        if self.deviation(iteration_us) > self.options.deviation_threshold:
            self._streak += 1
        else:
            self._streak = 0
        if self._streak >= self.options.consecutive:
            self._streak = 0
            self.state = TriggerState.PENDING
            self.fired += 1
            return True
        return False

    def should_switch(self, *, current_us: float, candidate_us: float) -> bool:
        """Whether a candidate schedule is worth switching to.

        Both times must be predictions under the same (new) estimate: the current schedule
        re-simulated on the re-estimated trace, and the candidate compiled for it.
        """
        _check_positive("current_us", current_us)
        if not math.isfinite(candidate_us) or candidate_us < 0:
            return False
        return (current_us - candidate_us) / current_us > self.options.gain_threshold

    def resolve(self, *, reference_us: float) -> None:
        """Close a re-estimation: ``reference_us`` is the prediction of the schedule that will run.

        Call it whether or not the schedule changed (then it is the old schedule's time under the
        new estimate); that moves the band to the new operating point, which is what keeps a
        persistent change from firing again.
        """
        _check_positive("reference_us", reference_us)
        self.reference_us = float(reference_us)
        self._streak = 0
        if self.options.cooldown_iterations > 0:
            self.state = TriggerState.COOLDOWN
            self._cooldown_left = self.options.cooldown_iterations
        else:
            self.state = TriggerState.WATCHING

    def abandon(self) -> None:
        """Close a re-estimation that failed (e.g. the compile raised): keep the old reference.

        The cool-down still applies so that a failing compile is not retried every K iterations.
        """
        self.resolve(reference_us=self.reference_us)


def _check_positive(name: str, value: float) -> None:
    require_number(value, field=name, above=0)
