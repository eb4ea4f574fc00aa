"""The least-regret choice among schedules when the cost model itself is uncertain.

A compiler optimises against its model, so it favours exactly the schedules whose time the
model under-estimates most. Where a part of the model is fitted rather than measured (what
compute loses beside communication, fitted from a short training run), two plausible models
can disagree on which schedule is best: one fit of that loss on VGG at 2 Gbit/s made the
compiler send the whole gradient as one unit after backward (predicted 678.8 ms), and the
run took 853.3 ms, while the schedule compiled under the probe's loss ran 631.1 ms
(docs/results.md). Hedging compiles under each model and ships the schedule whose worst
relative regret over the models is least: its replay under each model against the best
schedule there.

``regrets`` and ``least_regret`` are pure functions of a replay matrix; ``compile_trace(...,
hedge=...)`` builds the matrix (``pace.compiler``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pace.errors import InputError
from pace.ir import Trace


def regrets(replays_us: Sequence[Sequence[float]]) -> list[float]:
    """Per candidate (row), its worst relative regret over the models (columns):
    ``max_m replays[s][m] / min_s' replays[s'][m] - 1``.

    >>> [round(r, 6) for r in regrets([[100.0, 120.0], [110.0, 100.0]])]
    [0.2, 0.1]
    """
    if not replays_us or not replays_us[0]:
        raise InputError("needs at least one candidate and one model", field="hedge")
    n_models = len(replays_us[0])
    if any(len(row) != n_models for row in replays_us):
        raise InputError("every candidate needs one replay per model", field="hedge")
    best = [min(row[m] for row in replays_us) for m in range(n_models)]
    return [
        max(row[m] / best[m] - 1.0 if best[m] > 0 else 0.0 for m in range(n_models))
        for row in replays_us
    ]


TIE = 1e-3
"""Worst regrets closer than this (0.1%) are a tie: replays that differ by rounding alone must
not move the choice away from the main model's schedule."""


def least_regret(replays_us: Sequence[Sequence[float]], *, tie: float = TIE) -> int:
    """The candidate with the least worst regret (``regrets``), except that candidate 0 (the
    schedule compiled under the main model) wins unless another is better by more than ``tie``.
    Among the others the least wins (the first of equals): a tie kept for any earlier one
    shipped an unsearched schedule within ``tie`` of its own searched one, whose final search
    then ended worse under the other model than that one (hypothesis, 2026-11-28).

    >>> least_regret([[100.0, 120.0], [110.0, 100.0]])
    1
    >>> least_regret([[100.0, 100.05], [100.04, 100.0]])
    0
    """
    worst = regrets(replays_us)
    least = min(worst)
    return 0 if worst[0] <= least + tie else worst.index(least)


def check_alternatives(trace: Trace, alternatives: Sequence[Trace]) -> None:
    """Alternatives model the same job: the same ops and the same tensors (only the cost
    model, ``comm``, may differ); anything else is refused."""
    for k, alt in enumerate(alternatives):
        if alt.ops != trace.ops or alt.tensors != trace.tensors:
            raise InputError(
                f"alternative {k + 1} ({alt.model!r}) has other ops or tensors than the trace "
                f"({trace.model!r}): a hedge is another cost model of the same job, so only "
                "`comm` may differ",
                field="hedge",
            )


def robust_to_compute(
    nominal_us: Sequence[float],
    replays_us: Sequence[Sequence[float]],
    *,
    tolerance: float,
    tie: float = TIE,
) -> int:
    """The schedule to ship when the job may compute faster or slower than its trace says.

    Candidate 0 is the pipeline's choice; the others were compiled for the same trace with its
    compute scaled. ``nominal_us[i]``: candidate i's replay on the trace itself;
    ``replays_us[i]``: its replay in each compute-scaled world. Only candidates no more than
    ``tolerance`` (relative) slower than candidate 0 on the trace are admissible, so what the
    compiler promises for the trace holds; among them, the least worst regret over the worlds
    (``regrets``), ties (within ``tie``) keeping the earliest, candidate 0 first.

    Where compute hides the channel, many schedules tie on the trace, and the pipeline's pick
    among them can be one that a faster compute exposes: on a trace calibrated at 1 Gbit/s
    with Horovod, the shipped schedule and one compiled for compute 1.25x faster both replayed
    811 ms; with the compute the timed launch measured (15% faster), 734.4 against 686.5 ms
    (docs/scheduling.md, "Robust to the compute's speed").

    >>> robust_to_compute([100.0, 100.2, 130.0], [[90.0], [80.0], [70.0]], tolerance=0.005)
    1
    >>> robust_to_compute([100.0, 101.0], [[90.0], [80.0]], tolerance=0.005)
    0
    """
    if len(nominal_us) != len(replays_us) or not nominal_us:
        raise InputError(
            "needs one nominal replay and one row of world replays per candidate",
            field="compute_hedge",
        )
    admissible = [i for i, us in enumerate(nominal_us) if us <= nominal_us[0] * (1.0 + tolerance)]
    pick = least_regret([replays_us[i] for i in admissible], tie=tie)
    return admissible[pick]
