"""The one jitter model: random worlds around a trace's timings.

Real iterations scatter around the profiled timings: each op by a little (``op_sd``), a whole
pass at once when the machine is shared (``phase_sd``, one factor per phase), and the link
(``comm_sd``, one factor on both ``alpha_us`` and ``beta_us_per_byte``). Every factor is
lognormal with that log-standard-deviation, drawn from ``numpy.random.default_rng(seed)``, so a
model is deterministic. Two users, one objective (the mean over worlds):

* the compiler's robust selection (``pace.lp.robust``) replays candidate schedules in the
  worlds of ``JitterModel(op_sd=0.02)``, vectorised over :meth:`JitterModel.op_factors`;
* drift re-planning (``pace.drift.replan.JitterPredictor``) judges a switch by the mean
  prediction over the worlds of :meth:`JitterModel.traces`, with the dispersion the monitor
  observes per phase and on the link.

>>> from pace.synth import random_trace
>>> t = random_trace(seed=1, n_layers=2)
>>> m = JitterModel(phase_sd=0.05, comm_sd=0.1, samples=3, nominal_first=True)
>>> worlds = m.traces(t)
>>> len(worlds), worlds[0] == t, worlds[1] == t
(3, True, False)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pace.checks import require_int, require_number
from pace.ir import Trace

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, kw_only=True, slots=True)
class JitterModel:
    """``samples`` worlds; see the module docstring. ``nominal_first``: world 0 is the trace."""

    op_sd: float = 0.0
    phase_sd: float = 0.0
    comm_sd: float = 0.0
    samples: int = 8
    seed: int = 0
    nominal_first: bool = False

    def __post_init__(self) -> None:
        for name in ("op_sd", "phase_sd", "comm_sd"):
            require_number(getattr(self, name), field=name, minimum=0)
        require_int(self.samples, field="samples", minimum=1)

    def _draws(self, n_ops: int) -> tuple[FloatArray, FloatArray, FloatArray]:
        rng = np.random.default_rng(self.seed)
        # Drawn in this order whatever the sds, so one component's stream never depends on
        # another's setting (the robust selection's op factors are the first draw).
        ops = rng.lognormal(0.0, self.op_sd, size=(n_ops, self.samples))
        phases = rng.lognormal(0.0, self.phase_sd, size=(2, self.samples))
        comm = rng.lognormal(0.0, self.comm_sd, size=self.samples)
        if self.nominal_first:
            ops[:, 0] = 1.0
            phases[:, 0] = 1.0
            comm[0] = 1.0
        return ops, phases, comm

    def op_factors(self, trace: Trace) -> FloatArray:
        """Duration factor of op ``i`` in world ``w`` at ``[i, w]`` (per-op times per-phase)."""
        ops, phases, _ = self._draws(len(trace.ops))
        forward = np.array([op.phase == "forward" for op in trace.ops], dtype=bool)
        backward = np.array([op.phase == "backward" for op in trace.ops], dtype=bool)
        out = ops.copy()
        out[forward] *= phases[0]
        out[backward] *= phases[1]
        return out

    def comm_factors(self) -> FloatArray:
        """Factor on the link's ``alpha_us`` and ``beta_us_per_byte`` in each world."""
        return self._draws(0)[2]

    def traces(self, trace: Trace) -> list[Trace]:
        """The worlds as traces (same DAG and tensors; scaled durations and link)."""
        factors = self.op_factors(trace)
        comm = self.comm_factors()
        out = []
        for w in range(self.samples):
            if self.nominal_first and w == 0:
                out.append(trace)
                continue
            ops = tuple(
                dataclasses.replace(op, duration_us=op.duration_us * float(factors[i, w]))
                for i, op in enumerate(trace.ops)
            )
            c = float(comm[w])
            link = dataclasses.replace(
                trace.comm,
                alpha_us=trace.comm.alpha_us * c,
                beta_us_per_byte=trace.comm.beta_us_per_byte * c,
            )
            out.append(dataclasses.replace(trace, ops=ops, comm=link))
        return out

    def mean(self, trace: Trace, measure: Callable[[Trace], float]) -> float:
        """The objective: the mean of ``measure`` over the worlds."""
        worlds = self.traces(trace)
        return sum(measure(w) for w in worlds) / len(worlds)
